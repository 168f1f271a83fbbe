"""The sweep saved in a results folder: ``sweep.yaml`` (self-contained: base config and
space inline; an lr range whose high came from the boundary probe keeps the probed number
and its ``probed`` record, so a resumed or moved run never probes again) and
``sweep_state.json`` (where it was started from), written by ``sweeps run`` and read by
``resume``, ``audit``, ``--warm-start`` and the report."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps.state.layout import STATE_FILE, SWEEP_FILE
from sweeps.terminal import shell_word

if TYPE_CHECKING:
    from sweeps.spec.loader import Sweep


def save(sweep: Sweep) -> None:
    """Write ``sweep`` into its results folder: ``sweep.yaml`` self-contained (base config
    and space inline) and ``sweep_state.json`` (the sweep file, and the folders its trials
    import from and run in). The caller seals the folder afterwards."""
    import yaml

    from sweeps.state.atomic import write_text

    out = sweep.output_dir
    texts = {SWEEP_FILE: yaml.safe_dump(sweep.resolved(), sort_keys=False),
             STATE_FILE: json.dumps({"source": str(sweep.source or ""),
                                     "base_dir": str(sweep.base_dir),
                                     "workdir": str(sweep.workdir)}, indent=2)}
    for name, text in texts.items():
        write_text(out / name, text)
    _written[Path(out).resolve()] = texts


#: What :func:`save` last wrote (or :func:`read` last read) in each results folder, in
#: this process.
_written: dict[Path, dict[str, str]] = {}


def overwritten(folder: Path) -> list[str]:
    """The files :func:`save` wrote (or :func:`read` read: a resume) in ``folder`` in this
    process that no longer hold that text (a trainer writing into its results folder),
    written back; their names (empty when none changed, or nothing was saved here)."""
    from sweeps.state.atomic import write_text

    texts = _written.get(Path(folder).resolve(), {})
    changed = []
    for name, text in texts.items():
        try:
            same = (Path(folder) / name).read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            write_text(Path(folder) / name, text)
            changed.append(name)
    return changed


def read(folder: Path, *, import_trainer: bool = True, project: Path | None = None) -> Sweep:
    """The sweep saved in ``folder``, its results going back to that folder (wherever it
    was moved); its trials run in the folder it was started from (the sweep file's, if
    the state lacks it), or in ``project`` (``--project``: that folder is gone, e.g. a Ray
    job's temporary working_dir, or the project moved); the trainer is imported from
    there. Damaged files raise :class:`~sweeps.state.check.DamagedState`."""
    from sweeps.errors import SpecError
    from sweeps.spec.loader import load_sweep_dict, read_yaml
    from sweeps.state.check import read_sweep_state

    folder = Path(folder).resolve()
    state = read_sweep_state(folder)
    data = read_yaml(folder / SWEEP_FILE, f"DIR/{SWEEP_FILE}")
    base_dir, src = Path(state["base_dir"]), state.get("source")
    workdir = Path(state.get("workdir") or base_dir)  # a state written without it
    if project is not None:
        if not Path(project).is_dir():
            raise SpecError("--project", f"{project} is not a folder",
                            "give your project folder (where the trainer module lies)")
        base_dir = workdir = Path(project).resolve()
    elif import_trainer and not workdir.is_dir():
        raise SpecError("--project", f"the folder this sweep ran from, {workdir}, is gone (a "
                        "Ray job's temporary working_dir goes with its Ray session; or the "
                        "project moved)", "give your project folder: sweeps resume "
                        f"{shell_word(folder)} --project PATH (its trainer is imported from "
                        "there)")
    try:
        sweep = load_sweep_dict(data, base_dir=base_dir, workdir=workdir,
                                import_trainer=import_trainer)
    except SpecError as exc:
        if exc.key != "trainer" or project is not None:
            raise
        raise SpecError("trainer", exc.problem, f"{exc.fix}; if the project moved: sweeps "
                        f"resume {folder} --project PATH") from None
    _written[folder] = {name: (folder / name).read_text(encoding="utf-8")
                        for name in (SWEEP_FILE, STATE_FILE)}  # a resume checks them at its end
    return replace(sweep, output_dir=folder, source=Path(src) if src else None)


def exists(folder: Path) -> bool:
    """Whether ``folder`` holds a saved sweep (both files)."""
    return (Path(folder) / SWEEP_FILE).is_file() and (Path(folder) / STATE_FILE).is_file()
