"""The Lightning integration against the real ``lightning`` package, on CPU.

A small MLP regressor (``Probe``) records, through Lightning's own hooks and not through
sweeps, what each optimizer step saw: Lightning's ``grad_norm`` before clipping, the
norm and LR that reached the optimizer after clipping (``configure_gradient_clipping``),
and every training loss. The tests hold sweeps' reports against that record.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

try:
    import lightning.pytorch as pl
except ImportError:  # an optional extra: fail in CI, where it is installed
    if os.environ.get("CI"):
        raise
    pytest.skip("lightning is not installed (pip install 'sweeps[lightning]')",
                allow_module_level=True)
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities import grad_norm
from torch.utils.data import DataLoader, TensorDataset

from sweeps.integrations.lightning import SweepsCallback, fit, linear_warmup, trainer_args
from sweeps.rules.settings import RuleSettings
from sweeps.spec.loader import load_sweep
from sweeps.trial.reporter import TrialReporter, TrialStopped
from sweeps.trial.run import run_trainer
from tests.conftest import Reports, read_results_csv, run_cli_in

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning"
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
         "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains with one torch thread (see tests/conftest.py)."""


def total_norm(module: torch.nn.Module) -> float:
    grads = [p.grad.detach().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(grads)))


class Data(pl.LightningDataModule):
    """256 training samples (8 batches of 32: an epoch is 8 steps), one validation batch."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(384, 8, generator=g)
        y = torch.tanh(x @ torch.randn(8, 1, generator=g)) + 0.1 * torch.randn(384, 1,
                                                                                generator=g)
        self.train_set, self.val_set = TensorDataset(x[:256], y[:256]), TensorDataset(x[256:],
                                                                                      y[256:])
        self.teardowns: list[str] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=32, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)

    def teardown(self, stage: str) -> None:
        self.teardowns.append(stage)


class Probe(pl.LightningModule):
    """An MLP regressor that records what each optimizer step saw, sweeps aside."""

    def __init__(self, lr: float = 0.05, warmup_steps: int = 0, momentum: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))
        self.losses: list[float] = []  # every training_step
        self.pre_clip: list[float] = []  # Lightning's grad_norm, before clipping
        self.post_clip: list[float] = []  # the grads the optimizer steps with
        self.step_lrs: list[float] = []  # the LR the optimizer steps with
        self.val_losses: list[tuple[bool, float]] = []  # (sanity check?, loss)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.val_losses.append((self.trainer.sanity_checking, float(loss)))
        self.log("val_loss", loss)

    def on_before_optimizer_step(self, optimizer):  # after the callbacks' hook, before clip
        self.pre_clip.append(grad_norm(self, norm_type=2)["grad_2.0_norm_total"])

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None):
        super().configure_gradient_clipping(optimizer, gradient_clip_val,
                                            gradient_clip_algorithm)
        self.post_clip.append(total_norm(self))
        self.step_lrs.append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr,
                              momentum=self.hparams.momentum)
        return {"optimizer": opt, "lr_scheduler": linear_warmup(opt, self.hparams.warmup_steps)}


class Catch(pl.Callback):
    """Keeps the trainer ``fit`` built, and the stages its teardown hook saw."""

    def __init__(self) -> None:
        self.trainer: pl.Trainer | None = None
        self.teardowns: list[str] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        self.trainer = trainer

    def teardown(self, trainer, pl_module, stage) -> None:
        self.teardowns.append(stage)


def sweep_config(max_steps: int, clip: float | None = None, **trainer: object) -> dict:
    return {"trainer": {"gradient_clip_val": clip, **trainer},
            "sweep": {"trial_id": "t", "seed": 0, "max_steps": max_steps, "device": "cpu"}}


def train_reports(reports: list[dict]) -> list[dict]:
    return [r for r in reports if "loss" in r]


# --------------------------------------------------------------------------- what is reported


def test_pre_clip_grad_norm_lr_and_loss_of_every_step():
    reports = Reports()
    model = Probe(lr=0.2, warmup_steps=4)
    trainer = fit(sweep_config(10, clip=0.5), reports, model, Data())

    steps = train_reports(reports)
    assert [r["step"] for r in steps] == list(range(1, 11)) and trainer.global_step == 10
    assert len(model.pre_clip) == len(model.post_clip) == 10
    for r, pre, post, lr, loss in zip(steps, model.pre_clip, model.post_clip,
                                      model.step_lrs, model.losses, strict=True):
        assert r["grad_norm"] == pytest.approx(float(pre), rel=1e-5)
        assert r["lr"] == pytest.approx(lr, rel=1e-9)  # this step's LR, not the next one's
        assert r["loss"] == pytest.approx(loss, rel=1e-6)
        assert r["clipped"] == (1.0 if r["grad_norm"] > 0.5 else 0.0)
        assert post <= 0.5 * (1 + 1e-4) and r["nonfinite_grads"] == 0 == r["dead_params"]
        assert r["step_time"] > 0
    clipped = [r for r, post in zip(steps, model.post_clip, strict=True) if r["clipped"]]
    assert len(clipped) >= 5, "clipping must be active for the test to mean anything"
    assert all(r["grad_norm"] > 0.5 * 1.05 for r in clipped)  # pre-clip, not the clipped value
    # the warmup ramp: lr / 4 on step 1, the full LR from step 4
    assert [r["lr"] for r in steps[:5]] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2])
    # one Monitor (and its optimizer hook) per fit, not one per step
    assert len(trainer.optimizers[0]._optimizer_step_pre_hooks) <= 1


def test_gradient_accumulation_reports_once_per_optimizer_step():
    reports = Reports()
    model = Probe()
    fit(sweep_config(4), reports, model, Data(), accumulate_grad_batches=2)

    steps = train_reports(reports)
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and len(model.losses) == 8
    for i, r in enumerate(steps):
        assert r["loss"] == pytest.approx((model.losses[2 * i] + model.losses[2 * i + 1]) / 2,
                                          rel=1e-5)
        assert r["grad_norm"] == pytest.approx(float(model.pre_clip[i]), rel=1e-5)


class Labels(Probe):
    """A classifier whose ``training_step`` hands its class labels over as ``target``:
    classes 0, 1, 2 in shares 1/2, 1/4, 1/4, whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        target = torch.tensor([0, 0, 1, 2] * (len(x) // 4))
        pred = self.net(x)
        return {"loss": F.cross_entropy(pred, target), "pred": pred, "target": target}

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val_loss", F.cross_entropy(self.net(x), torch.zeros(len(x), dtype=int)))


def test_class_labels_handed_over_as_target_give_the_guess_of_their_frequencies():
    """flat_at_baseline judges a classifier of unequal class frequencies against their
    entropy; Lightning's callback reported neither label_entropy nor label_majority."""
    reports = Reports()
    fit(sweep_config(3), reports, Labels(), Data())

    steps = train_reports(reports)
    entropy = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert [r["label_entropy"] for r in steps] == pytest.approx([entropy] * 3)
    assert [r["label_majority"] for r in steps] == pytest.approx([0.5] * 3)
    assert all("pred_std" not in r for r in steps), "class scores have no collapse std"


def test_val_loss_after_each_validation_and_at_the_end_of_the_budget():
    reports = Reports()
    model = Probe()
    fit(sweep_config(12), reports, model, Data())

    vals = [r for r in reports if "val_loss" in r]
    # Lightning validates at the end of each 8-step epoch; the budget ends mid-epoch, so
    # fit validates once more at step 12. The sanity check is not reported.
    assert [r["step"] for r in vals] == [8, 12]
    real = [loss for sanity, loss in model.val_losses if not sanity]
    assert len(real) == 2 and any(sanity for sanity, _ in model.val_losses)
    assert [r["val_loss"] for r in vals] == pytest.approx(real, rel=1e-6)
    assert all("grad_norm" not in r for r in vals)  # a validation report judges no grads


class Renamed(Probe):
    """Logs its validation loss under another name than the callback's ``val_key``."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/mse", F.mse_loss(self.net(x), y))


def test_a_val_key_never_logged_reports_what_validation_did_log():
    """The module logs ``val/mse``, the callback reads ``val_loss``: besides the warning,
    each validation reports what it logged, so the sweep's error names it ("did you mean
    'val/mse'?") and does not offer the training loss."""
    from sweeps.trial.run import unreported

    reports = Reports()
    with pytest.warns(UserWarning, match="no 'val_loss' in trainer.callback_metrics"):
        fit(sweep_config(12), reports, Renamed(), Data())
    assert [r["step"] for r in reports if "val/mse" in r] == [8, 12]
    assert not any("val_loss" in r for r in reports)
    problem, fix = unreported("val_loss", list(reports))
    assert "val/mse" in problem and fix.startswith("did you mean 'val/mse'?")


def test_a_retried_trial_resumes_from_the_checkpoint_of_its_last_validation(tmp_path):
    """What sweeps does when a worker dies: the last state ``report`` was handed is saved
    with ``torch.save`` and its path comes back as ``config["sweep"]["checkpoint"]``."""
    first = Reports()
    fit(sweep_config(20), first, Probe(), Data())
    assert [step for step, _ in first.checkpoints] == [8, 16, 20], "each validation's"
    step, state = first.checkpoints[1]  # the worker died after step 16's validation
    path = tmp_path / "state.pt"
    torch.save(state, path)

    config = sweep_config(20)
    config["sweep"]["checkpoint"] = str(path)
    again, model = Reports(), Probe()
    fit(config, again, model, Data())
    steps = [r["step"] for r in train_reports(again)]
    assert steps == list(range(17, 21)), "continues after the checkpoint's step"
    resumed = {k: v for k, v in state["state_dict"].items()}
    fresh = Probe()  # the resumed weights came from the checkpoint, not a new init
    assert not torch.equal(resumed["net.0.weight"], fresh.state_dict()["net.0.weight"])
    assert [r["step"] for r in again if "val_loss" in r] == [20]

    quiet = Reports()
    fit(sweep_config(8), quiet, Probe(), Data(), checkpoint=False)
    assert not quiet.checkpoints and any("val_loss" in r for r in quiet)


def test_clip_zero_means_no_clipping_not_zero_gradients():
    reports = Reports()
    model = Probe(lr=0.2)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = fit(sweep_config(6, clip=0), reports, model, Data())

    assert trainer.gradient_clip_val is None
    steps = train_reports(reports)
    assert len(steps) == 6 and all("clipped" not in r for r in steps)
    for r, post in zip(steps, model.post_clip, strict=True):
        assert post > 0.1  # the optimizer got real gradients...
        assert post == pytest.approx(r["grad_norm"], rel=1e-5)  # ...the unclipped ones
    assert any(r["grad_norm"] > 1.0 for r in steps)  # large enough that a clip would show
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class CompiledProbe(Probe):
    def configure_model(self) -> None:  # Lightning calls it on every fit and validate
        if not isinstance(self.net, torch._dynamo.OptimizedModule):
            self.net = torch.compile(self.net, backend="eager")


def test_compile_s_is_the_first_step_of_a_compiled_model():
    compiled = Reports()
    eager = Reports()
    try:
        fit(sweep_config(3), compiled, CompiledProbe(), Data())
    finally:
        torch._dynamo.reset()
    fit(sweep_config(3), eager, Probe(), Data())

    steps = train_reports(compiled)
    assert steps[0]["compile_s"] == steps[0]["step_time"] > 0
    assert all("compile_s" not in r for r in steps[1:] + train_reports(eager))


# --------------------------------------------------------------------------- stopping


def test_a_diverging_lr_stops_the_users_own_trainer_on_the_step_it_shows():
    """The callback alone in a user's own Trainer: TrialStopped comes out of trainer.fit."""
    settings = RuleSettings(baseline_loss=1.0)
    results: list[dict] = []
    reporter = TrialReporter(settings, sink=results.append)
    model, data = Probe(lr=1e3), Data()
    trainer = pl.Trainer(max_steps=50, callbacks=[SweepsCallback(reporter)], **QUIET)

    with pytest.raises(TrialStopped) as stopped:
        trainer.fit(model, datamodule=data)

    verdict = stopped.value.verdict
    assert verdict is reporter.verdict
    # the first step whose pre-clip norm (Lightning's own) is over the cap, or not finite
    shows = next(i for i, n in enumerate(model.pre_clip, start=1)
                 if not math.isfinite(n) or n > settings.grad_norm_cap)
    assert (verdict.reason, verdict.step) == ("grad_blowup", shows)
    assert shows == 2 and verdict.evidence["grad_norm"] == pytest.approx(float(
        model.pre_clip[1]), rel=1e-5)
    # the Trainer ended there: no optimizer step and no forward pass after the verdict
    assert trainer.global_step == shows == len(model.post_clip) == len(model.losses)
    assert all(sanity for sanity, _ in model.val_losses), "no validation after the verdict"
    assert reporter.history[-1]["step"] == shows
    assert results[-1]["sweeps/status"] == "unstable"
    assert trainer.state.status == TrainerStatus.INTERRUPTED and trainer.interrupted


def test_fit_runs_the_teardown_hooks_after_a_stop_and_keeps_the_verdict():
    reporter = TrialReporter(RuleSettings(baseline_loss=1.0), sink=lambda r: None)
    catch, data = Catch(), Data()
    with pytest.raises(TrialStopped) as stopped:
        fit(sweep_config(50), reporter, lambda config: Probe(lr=1e3), data, callbacks=[catch])

    assert stopped.value.verdict is reporter.verdict is not None
    assert catch.trainer is not None and catch.trainer.global_step == reporter.verdict.step
    assert catch.trainer.state.status == TrainerStatus.INTERRUPTED
    assert catch.teardowns == ["fit"] and data.teardowns == ["fit"]


def test_a_lightning_cli_callback_entry_is_built_from_its_class_path():
    """A LightningCLI config lists ``trainer.callbacks`` as class_path/init_args mappings,
    which the Trainer refused as they were."""
    from lightning.pytorch.callbacks import Timer

    entry = {"class_path": "lightning.pytorch.callbacks.Timer",
             "init_args": {"duration": "00:00:10:00"}}
    trainer = fit(sweep_config(2, callbacks=[entry]), Reports(), Probe(), Data())
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    assert len(timers) == 1 and timers[0]._duration == 600
    with pytest.raises(ImportError, match=r"trainer.callbacks.0: class_path 'no.Such'"):
        trainer_args({"trainer": {"callbacks": [{"class_path": "no.Such"}]}})


def test_the_sweeps_trial_runner_sees_the_verdict_of_the_example():
    sweep = load_sweep(EXAMPLE / "sweep.yaml", workdir=EXAMPLE)
    results: list[dict] = []
    reporter = run_trainer(sweep, {"lr": 3.0, "grad_clip": 0, "warmup": 0}, "t1", results.append)

    assert reporter.verdict is not None
    final = results[-1]
    assert final["sweeps/status"] == "unstable"
    assert final["sweeps/reason"] in ("divergence", "grad_blowup", "non_finite")
    assert final["sweeps/stop_step"] == reporter.verdict.step == reporter.history[-1]["step"]
    assert reporter.verdict.step <= 10


# ------------------------------------------------------------------ the Trainer's arguments


def test_trainer_args_map_the_users_section_and_the_sweep():
    config = {"trainer": {"gradient_clip_val": 0, "max_epochs": 100, "max_steps": 5000,
                          "max_time": "00:01:00:00", "enable_checkpointing": True,
                          "accumulate_grad_batches": 4},
              "sweep": {"seed": 3, "max_steps": 7, "device": "cuda:1"}}
    args = trainer_args(config, logger=True, max_steps=99)

    assert args["gradient_clip_val"] is None  # 0 = off
    assert args["accumulate_grad_batches"] == 4  # the user's own settings stay
    assert args["enable_checkpointing"] is False and args["enable_progress_bar"] is False
    assert args["logger"] is True  # an explicit argument wins over the quiet defaults...
    assert (args["max_steps"], args["max_epochs"], args["max_time"]) == (7, -1, None)  # ...
    assert (args["accelerator"], args["devices"]) == ("gpu", [1])  # not over the sweep's
    assert [type(p) for p in args["plugins"]] == [LightningEnvironment]

    own = trainer_args({"trainer": {"gradient_clip_val": 2, "max_epochs": 3}})
    assert own["gradient_clip_val"] == 2.0 and own["max_epochs"] == 3
    assert "max_steps" not in own and "accelerator" not in own and "plugins" not in own


def test_a_trial_in_a_slurm_job_is_one_local_process(monkeypatch):
    """Ray workers inherit the SLURM variables of the job that started them; Lightning
    would read them as a multi-task launch."""
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "sweeps-ray")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    with pytest.raises(RuntimeError, match="ntasks"):
        pl.Trainer(max_steps=1, **QUIET)  # what a plain Trainer does in such a worker
    reports = Reports()
    fit(sweep_config(2), reports, Probe, Data())
    assert [r["step"] for r in train_reports(reports)] == [1, 2]


def test_no_srun_hint_for_a_trial_on_a_machine_with_slurm(monkeypatch, tmp_path):
    """Lightning warns that `srun` is available but not used on every trial of a machine
    with SLURM installed (a hint to prepend `srun` to `sweeps try`); a trial is one
    process that Ray placed, so the hint is noise there."""
    import os
    import warnings

    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fit(sweep_config(2), Reports(), Probe, Data())
    assert not [w for w in seen if "`srun` command is available" in str(w.message)]


# --------------------------------------------------------------------------- a real sweep


@pytest.mark.slow
def test_sweep_of_the_example_hands_over_yaml_the_users_script_runs(tmp_path, ray_session):
    folder = tmp_path / "lightning"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("results", "__pycache__",
                                                                    "lightning_logs"))
    sweep_file = folder / "sweep.yaml"
    spec = yaml.safe_load(sweep_file.read_text())
    spec.update(budget={"trials": 2, "max_steps": 40, "concurrent": 2, "scheduler": "none"},
                # selection is not under test: a 40-step run's seed noise is wide
                confirm={"seeds": 1, "lr_probe": 0, "keep": 1, "max_candidates": 1,
                         "tolerance": 1.0, "base": False},
                initial_points=[{"lr": 3.0, "grad_clip": 0}, {"lr": 0.05, "grad_clip": 1.0}])
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))

    assert run_cli_in(folder, "run", "sweep.yaml", "--quiet") == 0
    results = folder / "results" / "lightning-regression"
    trials = read_results_csv(results / "trials.csv")
    search = trials[trials["role"] == "search"]
    assert len(search) == 2 and set(search["status"]) <= {"ok", "unstable"}
    blown = search[(search["lr"] - 3.0).abs() < 1e-9].iloc[0]
    assert blown["status"] == "unstable"
    assert blown["reason"] in ("divergence", "grad_blowup", "non_finite")
    assert int(blown["steps"]) == int(blown["stop_step"]) <= 10
    healthy = search[(search["lr"] - 0.05).abs() < 1e-9].iloc[0]
    assert healthy["status"] == "ok" and int(healthy["steps"]) == 40
    assert healthy["objective_val_loss"] < 0.9  # below the predict-the-mean baseline 1.0

    files = sorted((results / "stable").glob("rank-*.yaml"))
    assert files
    base = yaml.safe_load((folder / "config.yaml").read_text())
    handed = yaml.safe_load(files[0].read_text())
    assert list(handed) == list(base) and list(handed["trainer"]) == list(base["trainer"])
    row = trials[trials["trial_id"] == files[0].stem.split("-", 2)[2]].iloc[0]
    assert handed["model"]["lr"] == pytest.approx(row["lr"])
    assert handed["trainer"]["gradient_clip_val"] == pytest.approx(row["grad_clip"])

    # the user's own script runs the handed-over file as it is (cut short here)
    spec_ = importlib.util.spec_from_file_location("lightning_example_train", folder / "train.py")
    script = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(script)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        val_loss = script.main(["--config", str(files[0]), "--max-steps", "5"])
    finally:
        os.chdir(cwd)
    assert math.isfinite(val_loss)
