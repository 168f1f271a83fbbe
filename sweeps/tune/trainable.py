"""Ray Tune's function trainable: a trial of the sweep in a Ray worker, with its
checkpoints on their way to Ray; the trial itself runs in :func:`sweeps.trial.run.run_trainer`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import ray
from ray import tune

from sweeps.spec.loader import Sweep
from sweeps.trial.run import flat_config, is_probe, prepare_process, run_trainer


def ray_trainable(config: dict[str, Any], sweep: Sweep) -> None:
    """Ray Tune function trainable (bound to the sweep with ``tune.with_parameters``)."""
    prepare_process(sweep, int(sweep.spec.resources.cpu))
    global _working_dir
    _working_dir = os.getcwd()  # the trial's working folder in Ray's session (see scratch_dir)
    if sweep.workdir.is_dir():  # Ray Tune starts each trial in its own folder; a trainer's
        os.chdir(sweep.workdir)  # relative paths mean the folder sweeps was started from
    config = flat_config(config)
    restored = tune.get_checkpoint()
    path = None
    if restored is not None:  # a retried trial: its trainer state, in the trial's folder
        local = Path(tempfile.mkdtemp(prefix="sweeps-restored-", dir=scratch_dir()))
        restored.to_directory(str(local))
        path = str(local / CHECKPOINT_FILE)
    run_trainer(sweep, config, tune.get_context().get_trial_id(), tune.report,
                checkpoint_sink=_ray_checkpoint, checkpoint_path=path,
                gpu_ids=assigned_gpu_ids(), hold=is_probe(config))


#: The folder Ray Tune started the running trial in (its ``working_dirs/<trial>``).
_working_dir: str | None = None


def scratch_dir() -> str:
    """A folder of the trial's own in Ray's session (removed with it), for checkpoint files
    on their way to Ray: a trial Ray stops inside ``report`` never leaves a ``with``
    block, so a folder of the system temp dir would be left behind.

    The trial's working folder (``working_dirs/<trial>``, where Ray Tune starts it), which
    Ray does not copy to the results folder: the trial's folder under ``driver_artifacts``
    is copied whenever Ray Tune saves the experiment state, and a checkpoint folder
    removed during that copy logged a FileNotFoundError traceback. Else that trial
    folder; on a node other than the driver's neither is there: the system temp dir."""
    if _working_dir and "working_dirs" in Path(_working_dir).parts and \
            os.path.isdir(_working_dir):
        return _working_dir
    folder = tune.get_context().get_trial_dir()
    return folder if folder and os.path.isdir(folder) else tempfile.gettempdir()


#: File name of a trainer's state inside a Ray Tune checkpoint.
CHECKPOINT_FILE = "trainer_state.pt"


def _ray_checkpoint(result: dict[str, Any], state: Any) -> None:
    """Report ``result`` to Ray Tune with the trainer's ``state`` as its checkpoint."""
    import torch

    with tempfile.TemporaryDirectory(prefix="sweeps-ckpt-", dir=scratch_dir()) as folder:
        torch.save(state, Path(folder) / CHECKPOINT_FILE)
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))


def assigned_gpu_ids() -> list[Any]:
    """The GPU ids Ray assigned to this worker (``ray.get_gpu_ids()``; [] outside Ray)."""
    try:
        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return []
