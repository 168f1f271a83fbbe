"""Damaged state is found before anything runs.

One small real sweep, then its journals cut at many byte offsets: a torn last line (what a
SIGKILL during an append leaves) is dropped with every complete line kept; a garbled line
before the last, bytes that are not UTF-8, a garbled sweep_state.json or sweep.yaml, a
symlinked state file and a cut trials.csv all exit 2 naming the file and the line, before
anything runs or is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

from sweeps.commands.cli import main
from sweeps.record.journal import Journal
from sweeps.state.check import DamagedState, check_journals
from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

pytestmark = pytest.mark.slow

TRIALS = 4


@pytest.fixture(scope="module")
def swept(tmp_path_factory, ray_session) -> Path:
    folder = copy_sweepfiles(tmp_path_factory.mktemp("damage"))
    edit_linreg(folder, name="journaled",
                budget={"trials": TRIALS, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                search_space={"lr": {"type": "loguniform", "low": 1e-2, "high": 0.5}},
                confirm={"seeds": 0, "lr_probe": 0})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    return folder / "results" / "journaled"


def _journals_only(out: Path, dest: Path) -> Path:
    """The journals of ``out`` alone (what the checker reads), in ``dest``."""
    (dest / "trials").mkdir(parents=True)
    for path in (out / "trials").glob("*.jsonl"):
        shutil.copy(path, dest / "trials" / path.name)
    shutil.copy(out / "optuna.journal", dest / "optuna.journal")
    return dest


def _copy(out: Path, dest: Path) -> Path:
    shutil.copytree(out, dest, ignore=shutil.ignore_patterns("ray", "confirm*", "inductor_cache",
                                                             "*.png"))
    return dest


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (".sweeps.owner", ".sweeps.lock")}


def _targets(folder: Path) -> list[Path]:
    """The longest trial journal and the Optuna journal."""
    longest = max((folder / "trials").glob("*.jsonl"), key=lambda p: p.stat().st_size)
    return [longest, folder / "optuna.journal"]


def _offsets(data: bytes) -> list[int]:
    """Every 7th byte, every byte of the last two lines, and both sides of every newline."""
    tail = data.rstrip(b"\n").rfind(b"\n", 0, data.rstrip(b"\n").rfind(b"\n"))
    near = {i + d for i, b in enumerate(data) if b == 0x0A for d in (-1, 0, 1, 2)}
    return sorted({k for k in set(range(0, len(data), 7)) | set(range(max(tail, 0), len(data)))
                   | near if 0 <= k <= len(data)})


def test_a_torn_last_line_at_any_offset_is_dropped_and_every_complete_line_kept(swept,
                                                                              tmp_path):
    folder = _journals_only(swept, tmp_path / "j")
    others = _snapshot(folder)
    all_finished = check_journals(folder, repair=False).finished
    assert len(all_finished) == TRIALS
    for path in _targets(folder):
        rel = str(path.relative_to(folder))
        data = path.read_bytes()
        offsets = _offsets(data)
        assert len(offsets) > 100
        for k in offsets:
            path.write_bytes(data[:k])
            notes: list[str] = []
            result = check_journals(folder, repair=True, echo=notes.append)
            keep = data.rfind(b"\n", 0, k) + 1
            if k < len(data) and data[k] == 0x0A and k > keep:  # whole but for its newline
                expected, dropped = data[:k + 1], 0
            else:
                expected, dropped = data[:keep], k - keep
            assert path.read_bytes() == expected, (rel, k)
            if dropped:
                assert notes == [f"note: {rel}: dropped a torn last line ({dropped} byte"
                                 f"{'s' if dropped != 1 else ''}) left by an interrupted write"]
            else:
                assert notes == []
            assert {k2: v for k2, v in _snapshot(folder).items() if k2 != rel} == \
                {k2: v for k2, v in others.items() if k2 != rel}, "no other file touched"
            if path.suffix == ".jsonl":  # every complete event is read back, nothing else
                lines = [json.loads(x) for x in expected.splitlines()]
                events = Journal(folder / "trials").read()[path.stem]
                assert [kind for kind, _ in events] == [next(iter(x)) for x in lines]
                finished = any(x.get("outcome", {}).get("finished") for x in lines)
                assert result.finished == all_finished - ({path.stem} - (
                    {path.stem} if finished else set()))
            elif k % 5 == 0:  # the repaired study loads
                storage = optuna.storages.JournalStorage(
                    optuna.storages.journal.JournalFileBackend(str(path)))
                names = optuna.study.get_all_study_names(storage)
                assert names in ([], ["journaled"])
        path.write_bytes(data)


def test_a_garbled_line_before_the_last_exits_2_naming_the_file_and_line(swept, tmp_path):
    folder = _journals_only(swept, tmp_path / "j")
    for path in _targets(folder):
        rel = str(path.relative_to(folder))
        data = path.read_bytes()
        tried = 0
        for k in range(1, len(data), 5):
            start = data.rfind(b"\n", 0, k) + 1
            end = data.find(b"\n", k)
            if k == start or end == -1 or end + 1 >= len(data):
                continue  # a line boundary, or the last line (a torn tail)
            # a torn line that the driver appended after: what an append onto a torn tail
            # leaves, and what resume used to produce
            spliced = data[:k] + data[end + 1:]
            path.write_bytes(spliced)
            line = data.count(b"\n", 0, k) + 1
            with pytest.raises(DamagedState) as info:
                check_journals(folder, repair=True)
            assert info.value.key == f"{rel} line {line}", (k, info.value)
            assert "damaged" in info.value.problem and info.value.fix
            assert path.read_bytes() == spliced, "nothing repaired when damage is found"
            tried += 1
        assert tried > 50
        lines = data.splitlines(keepends=True)
        for bad, why in ((b"\xff\xfe" + lines[1], "not UTF-8"), (b"[1, 2]\n", "")):
            path.write_bytes(lines[0] + bad + b"".join(lines[1:]))
            with pytest.raises(DamagedState) as info:
                check_journals(folder, repair=True)
            assert info.value.key == f"{rel} line 2" and why in info.value.problem
        path.write_bytes(data)


def _resume_refused(capsys, folder: Path, *names: str) -> str:
    before = _snapshot(folder)
    # a copy is another folder than the one its seal vouches for: trusted here, so that
    # the checks of the state files themselves are what refuses
    assert main(["resume", str(folder), "--quiet", "--trust-state"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fix:" in err and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    assert _snapshot(folder) == before, ("nothing written, nothing run", err)
    return err


def test_damaged_state_files_stop_resume_before_anything_runs(swept, tmp_path, capsys):
    folder = _copy(swept, tmp_path / "copy")
    journal = _targets(folder)[0]
    rel = f"trials/{journal.name}"
    data = journal.read_bytes()
    first_nl = data.find(b"\n")
    journal.write_bytes(data[:first_nl - 3] + data[first_nl:])  # line 1 garbled
    _resume_refused(capsys, folder, f"{rel} line 1", "is damaged", "delete that line")
    journal.write_bytes(data[:first_nl + 1] + b'{"metrics": {"loss": 0.5\xff}}\n'
                        + data[first_nl + 1:])
    _resume_refused(capsys, folder, f"{rel} line 2", "not UTF-8")
    journal.write_bytes(b'{"trial": {"values": {}, "seed": "abc"}}\n' + data[first_nl + 1:])
    _resume_refused(capsys, folder, f"{rel} line 1", "does not hold what sweeps wrote")
    journal.write_bytes(data)

    state = (folder / "sweep_state.json").read_bytes()
    (folder / "sweep_state.json").write_bytes(state[:-10])
    _resume_refused(capsys, folder, "sweep_state.json line", "not valid JSON", "base_dir")
    (folder / "sweep_state.json").write_bytes(state)

    sweep_yaml = (folder / "sweep.yaml").read_bytes()
    (folder / "sweep.yaml").write_bytes(sweep_yaml.replace(b"budget:", b"budget: [", 1))
    _resume_refused(capsys, folder, "sweep.yaml line", "not valid YAML")
    (folder / "sweep.yaml").write_bytes(b"name: x\n\xc3\x28\n")
    _resume_refused(capsys, folder, "sweep.yaml line 2", "not UTF-8")
    (folder / "sweep.yaml").write_bytes(sweep_yaml)

    for name in ("mlflow.db", "optuna.journal", rel):
        real = folder / name
        kept = tmp_path / "outside" / real.name
        kept.parent.mkdir(exist_ok=True)
        shutil.move(real, kept)
        real.symlink_to(kept)
        content = kept.read_bytes()
        _resume_refused(capsys, folder, name, "is a symlink")
        assert kept.read_bytes() == content, "the link's target is not touched"
        real.unlink()
        shutil.move(kept, real)


def _garble_row(csv: bytes, index: int) -> bytes:
    rows = csv.splitlines(keepends=True)
    rows[index] = rows[index].rstrip(b"\n") + b",extra\n"
    return b"".join(rows)


def test_a_cut_or_incomplete_trials_csv_stops_report(swept, tmp_path, capsys):
    folder = _copy(swept, tmp_path / "copy")
    csv = (folder / "trials.csv").read_bytes()
    report = (folder / "report.html").stat().st_mtime_ns
    cases = [
        (csv[:len(csv) - 25], ["trials.csv line", "cut off"]),  # a cut last row
        (_garble_row(csv, 1), ["trials.csv line 2", "fields"]),  # a garbled row
        (b"".join(csv.splitlines(keepends=True)[:-1]), ["trials.csv", "lacks 1 trial"]),
        (csv[:20], ["trials.csv line 1", "cut off"]),
    ]
    for damaged, names in cases:
        (folder / "trials.csv").write_bytes(damaged)
        for fmt in ("html", "json", "csv"):
            assert main(["report", str(folder), "--format", fmt]) == 2
            err = capsys.readouterr().err
            assert "Traceback" not in err and f"sweeps resume {folder}" in err
            for name in names:
                assert name in err, (name, err)
        assert (folder / "report.html").stat().st_mtime_ns == report
    (folder / "trials.csv").write_bytes(csv)
    assert main(["report", str(folder)]) == 0


def test_report_on_outputs_a_dead_driver_left_half_written_exits_2(swept, tmp_path, capsys):
    """The driver died after trials.csv, before pareto.csv and stable/ were whole: report
    says the outputs are incomplete and that resume completes them (not "none", exit 0)."""
    folder = _copy(swept, tmp_path / "half")
    stable = sorted((folder / "stable").glob("rank-*.yaml"))
    assert stable, "the module's sweep handed something over"
    stable[0].unlink()
    assert main(["report", str(folder), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert f"{stable[0].relative_to(folder)}: is listed in pareto.csv but missing" in err
    assert f"sweeps resume {folder}" in err
    (folder / "pareto.csv").unlink()
    assert main(["report", str(folder)]) == 2
    assert "pareto.csv: is missing: the sweep's outputs are incomplete" in \
        capsys.readouterr().err


def test_resume_drops_torn_tails_and_keeps_every_complete_trial(swept, capsys):
    """Last: resumes the module's sweep in place (a copied folder still points at its
    original through Ray's saved state)."""
    out = swept
    before = read_results_csv(out / "trials.csv")
    study = out / "optuna.journal"
    data = study.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    study.write_bytes(data[:last + (len(data) - last) // 2])  # the last op torn in half
    journal = _targets(out)[0]
    whole = journal.read_bytes()
    line = whole.splitlines(keepends=True)[1]
    journal.write_bytes(whole + line[:len(line) // 2])  # a torn append after the outcome
    torn = len(line) // 2

    assert main(["resume", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"note: trials/{journal.name}: dropped a torn last line ({torn} bytes)" in err
    assert "note: optuna.journal: dropped a torn last line" in err
    assert journal.read_bytes() == whole
    after = read_results_csv(out / "trials.csv")
    assert set(before["trial_id"]) <= set(after["trial_id"]), "every complete trial kept"
    assert len(after[after["role"] == "search"]) >= TRIALS
    study_now = optuna.load_study(study_name="journaled", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(study))))
    assert len(study_now.trials) == TRIALS
    assert (out / "report.html").is_file()
