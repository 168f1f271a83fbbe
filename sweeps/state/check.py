"""Damaged state is found before anything runs.

``sweeps resume`` and ``sweeps report`` check a results folder's state files
first:

- A torn last line of an append-only journal (``trials/<id>.jsonl``,
  ``optuna.journal``) is what a driver killed during an append leaves: ``resume``
  cuts it off (``truncate`` to the last complete line) and says so in one line.
- Anything else (a garbled line before the last, bytes that are not UTF-8, a
  ``sweep.yaml`` or ``sweep_state.json`` that does not parse, a truncated or
  garbled ``trials.csv``) is :class:`DamagedState`: exit 2 naming the file, the
  line and what to do, before any trial starts.
- A state file that is a symlink is refused (:class:`DamagedState`, exit 2): the
  driver writes them, and a symlink would send its writes elsewhere.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweeps.errors import SpecError
from sweeps.record.journal import JournalDamaged, Parsed, drop_torn_tail, event_problem, parse_lines
from sweeps.state.layout import (
    MLFLOW_DB,
    PARETO_CSV,
    STATE_FILE,
    STUDY_FILE,
    SWEEP_FILE,
    TRIALS_DIR,
)
from sweeps.terminal import shell_word

#: Files and folders of a results folder the driver writes or reads back.
STATE_FILES = (SWEEP_FILE, STATE_FILE, STUDY_FILE, MLFLOW_DB, TRIALS_DIR)


class DamagedState(SpecError):
    """A state file is damaged beyond a torn last line, or is a symlink (exit 2)."""


@dataclass
class CheckResult:
    """What the check found and repaired."""

    repaired: list[str] = field(default_factory=list)  # one line per file repaired
    finished: set[str] = field(default_factory=set)  # trial ids the journals show finished


def _rel(folder: Path, path: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


def refuse_symlinks(folder: Path) -> None:
    """:class:`DamagedState` if a state file (or ``trials/`` or a journal in it) is a symlink."""
    folder = Path(folder)
    paths = [folder / name for name in STATE_FILES]
    if (folder / "trials").is_dir() and not (folder / "trials").is_symlink():
        paths += sorted((folder / "trials").glob("*.jsonl"))
    for path in paths:
        if path.is_symlink():
            raise DamagedState(
                str(path), f"is a symlink (to {os.readlink(path)}); sweeps does not follow "
                "state files through symlinks, since its writes would land elsewhere",
                f"replace the link by the file itself (cp --remove-destination "
                f"\"$(readlink -f {path})\" {path}) if you trust its target, or remove it")


def _text(folder: Path, path: Path, fix: str) -> str:
    """The file as UTF-8 text, or DamagedState naming the line of the first bad byte."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DamagedState(f"{_rel(folder, path)} line {line}",
                           "holds bytes that are not UTF-8 text (a damaged file)", fix) from None


_YAML_FIX = ("restore it from a backup or rewrite it: it is the sweep as it ran (your sweep "
             "file with base_config and search_space inline); `sweeps run` writes it afresh")
_STATE_FIX = ('rewrite it as {"source": "<the sweep file>", "base_dir": "<the folder of the '
              'sweep file>", "workdir": "<the folder sweeps was started from>"}')


def check_sweep_files(folder: Path, *, required: bool = True) -> None:
    """``sweep.yaml`` and ``sweep_state.json`` parse (if present, or ``required``)."""
    folder = Path(folder)
    path = folder / "sweep.yaml"
    if path.is_file() or required:
        text = _text(folder, path, _YAML_FIX)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise DamagedState(f"sweep.yaml{where}", f"is not valid YAML ({problem})",
                               _YAML_FIX) from None
        if not isinstance(data, dict):
            raise DamagedState("sweep.yaml", "does not hold a mapping (a damaged file)",
                               _YAML_FIX)
    path = folder / "sweep_state.json"
    if path.is_file() or required:
        read_sweep_state(folder)


def read_sweep_state(folder: Path) -> dict[str, Any]:
    """``sweep_state.json``, or DamagedState naming the line that does not parse."""
    folder = Path(folder)
    text = _text(folder, folder / "sweep_state.json", _STATE_FIX)
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise DamagedState(f"sweep_state.json line {getattr(exc, 'lineno', '?')}",
                           f"is not valid JSON ({getattr(exc, 'msg', exc)})",
                           _STATE_FIX) from None
    if not isinstance(state, dict) or not isinstance(state.get("base_dir"), str) or \
            not isinstance(state.get("source", ""), str):
        raise DamagedState("sweep_state.json", "does not hold {\"source\": ..., \"base_dir\": "
                           "...} (a damaged file)", _STATE_FIX)
    return state


def _study_problem(value: Any) -> str | None:
    if not isinstance(value, dict) or "op_code" not in value:
        return "not an Optuna journal operation (a JSON object with an op_code)"
    return None


def _journal_fix(folder: Path, path: Path) -> str:
    if path.name == STUDY_FILE:
        return ("restore optuna.journal from a backup; without one, the search cannot be "
                "continued: start it afresh with `sweeps run` (these results are moved aside "
                "first, nothing is overwritten)")
    return (f"restore {_rel(folder, path)} from a backup, or delete that line and every line "
            f"after it (the trial then counts as unfinished and runs again on `sweeps "
            f"resume`)")


def _parse(folder: Path, path: Path, check: Callable[[Any], str | None]) -> Parsed:
    try:
        return parse_lines(path, check)
    except JournalDamaged as exc:
        raise DamagedState(f"{_rel(folder, path)} line {exc.line}", f"is damaged: {exc.why}",
                           _journal_fix(folder, path)) from None


def journals(folder: Path) -> list[Path]:
    """The append-only journals of a results folder: trials/*.jsonl, then optuna.journal."""
    folder = Path(folder)
    out = sorted((folder / "trials").glob("*.jsonl")) if (folder / "trials").is_dir() else []
    if (folder / STUDY_FILE).exists():
        out.append(folder / STUDY_FILE)
    return out


def check_journals(folder: Path, *, repair: bool,
                   echo: Callable[[str], None] | None = None) -> CheckResult:
    """Parse every journal; with ``repair``, cut torn last lines off (one line said per
    file). Any other damage raises DamagedState before anything is changed."""
    folder = Path(folder)
    result = CheckResult()
    parsed: list[tuple[Path, Parsed]] = []
    for path in journals(folder):
        check = _study_problem if path.name == STUDY_FILE else event_problem
        p = _parse(folder, path, check)
        parsed.append((path, p))
        if check is event_problem:
            for value in p.lines:
                (kind, payload), = value.items()
                if kind == "outcome" and payload.get("finished"):
                    result.finished.add(path.stem)
    if repair:  # only once every journal is known to be sound but for torn tails
        for path, p in parsed:
            dropped = drop_torn_tail(path, p)
            if dropped:
                line = (f"note: {_rel(folder, path)}: dropped a torn last line ({dropped} "
                        f"byte{'s' if dropped != 1 else ''}) left by an interrupted write")
                result.repaired.append(line)
                if echo is not None:
                    echo(line)
        _drop_stale_study_lock(folder, result, echo)
    return result


def _drop_stale_study_lock(folder: Path, result: CheckResult,
                           echo: Callable[[str], None] | None) -> None:
    """Optuna's journal lock (``optuna.journal.lock``, a symlink) left by a killed driver.

    Only the driver holding the results folder writes the study, so with the folder held
    a lock file left there is stale; Optuna would wait 30 s before breaking it itself.
    """
    lock = folder / f"{STUDY_FILE}.lock"
    if os.path.lexists(lock):
        os.unlink(lock)
        line = f"note: removed {_rel(folder, lock)}, left by a driver that died holding it"
        result.repaired.append(line)
        if echo is not None:
            echo(line)


def check_for_resume(folder: Path, echo: Callable[[str], None] | None = None) -> CheckResult:
    """Everything ``sweeps resume`` reads, checked (and torn tails repaired) before it
    starts; the caller holds the folder."""
    folder = Path(folder)
    refuse_symlinks(folder)
    check_sweep_files(folder, required=True)
    return check_journals(folder, repair=True, echo=echo)


_CSV_FIX = "run `sweeps resume {folder}` to rebuild it from the journals in trials/"


def check_trials_csv(folder: Path) -> int:
    """``trials.csv`` is whole: UTF-8, every row as long as the header, ending with a
    newline. Returns its row count."""
    folder = Path(folder)
    path = folder / "trials.csv"
    fix = _CSV_FIX.format(folder=shell_word(folder))
    if path.is_symlink():
        raise DamagedState("trials.csv", f"is a symlink (to {os.readlink(path)})", fix)
    text = _text(folder, path, fix)
    if not text.strip():
        raise DamagedState("trials.csv", "is empty", fix)
    if not text.endswith("\n"):
        last = text.count("\n") + 1
        raise DamagedState(f"trials.csv line {last}", "is cut off (the file does not end "
                           "with a complete row)", fix)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
        if "trial_id" not in header or "status" not in header:
            raise DamagedState("trials.csv line 1", "has no trial_id/status header", fix)
        rows = 0
        for row in reader:
            if len(row) != len(header):
                raise DamagedState(f"trials.csv line {reader.line_num}",
                                   f"has {len(row)} fields where the header has "
                                   f"{len(header)} (a damaged file)", fix)
            rows += 1
    except csv.Error as exc:
        raise DamagedState(f"trials.csv line {reader.line_num}", f"is not valid CSV ({exc})",
                           fix) from None
    return rows


def check_for_report(folder: Path) -> None:
    """What ``sweeps report`` reads: trials.csv whole and holding every trial the journals
    show finished, sweep.yaml (if any) parsing. Reads only."""
    folder = Path(folder)
    check_trials_csv(folder)
    for name in ("sweep.yaml", "pareto.csv"):
        if (folder / name).is_symlink():
            raise DamagedState(name, f"is a symlink (to {os.readlink(folder / name)})",
                               "replace the link by the file itself, or remove it")
    check_sweep_files(folder, required=False)
    try:
        finished = check_journals(folder, repair=False).finished
    except DamagedState:
        return  # the journals matter to `resume`, which says so; trials.csv is what is read
    with open(folder / "trials.csv", newline="", encoding="utf-8") as fh:
        listed = {row.get("trial_id") for row in csv.DictReader(fh)}
    missing = sorted(finished - listed)
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise DamagedState("trials.csv", f"lacks {len(missing)} trial(s) the journals in "
                           f"trials/ show finished ({shown})",
                           _CSV_FIX.format(folder=shell_word(folder)))
    check_outputs(folder)


def check_outputs(folder: Path) -> None:
    """The outputs after trials.csv were all written: pareto.csv, and every stable/ YAML it
    lists (a driver stopped while writing them leaves trials.csv alone). Reads only."""
    fix = (f"run `sweeps resume {shell_word(folder)}`: it writes the outputs again from the "
           "journals (no trial runs again)")
    pareto = folder / PARETO_CSV
    if not pareto.is_file():
        raise DamagedState("pareto.csv", "is missing: the sweep's outputs are incomplete (its "
                           "driver stopped while writing them)", fix)
    try:
        with open(pareto, newline="", encoding="utf-8") as fh:
            listed = [row.get("yaml") or "" for row in csv.DictReader(fh)]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DamagedState("pareto.csv", f"cannot be read ({exc})", fix) from None
    lost = [name for name in listed if name and not (folder / name).is_file()]
    if lost:
        raise DamagedState(lost[0], "is listed in pareto.csv but missing: the sweep's outputs "
                           "are incomplete (its driver stopped while writing them)", fix)
