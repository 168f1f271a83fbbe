"""Per-trial journal files: written whole, read back, torn tails and damage told apart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sweeps.errors import SpecError
from sweeps.record.journal import (
    Journal,
    JournalDamaged,
    drop_torn_tail,
    event_problem,
    parse_lines,
)


def _journal_with_one_trial(folder: Path) -> Journal:
    journal = Journal(folder)
    journal.write("t1", "trial", {"lr": 0.01, "seed": 3})
    journal.write("t1", "metrics", {"step": 1, "val_loss": float("nan"),
                                    "grad": float("inf"), "low": float("-inf")})
    journal.write("t1", "outcome", {"status": "ok"})
    journal.close_all()
    return journal


def test_events_read_back_in_order_with_non_finite_numbers(tmp_path: Path) -> None:
    journal = _journal_with_one_trial(tmp_path / "trials")
    events = journal.read()
    assert list(events) == ["t1"]
    kinds = [kind for kind, _ in events["t1"]]
    assert kinds == ["trial", "metrics", "outcome"]
    metrics = events["t1"][1][1]
    assert math.isnan(metrics["val_loss"])
    assert metrics["grad"] == math.inf and metrics["low"] == -math.inf
    assert events["t1"][0][1] == {"lr": 0.01, "seed": 3}


def test_every_line_ends_with_a_newline(tmp_path: Path) -> None:
    _journal_with_one_trial(tmp_path)
    data = (tmp_path / "t1.jsonl").read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 3


def test_missing_folder_reads_as_no_trials(tmp_path: Path) -> None:
    assert Journal(tmp_path / "absent").read() == {}


def test_torn_last_line_is_skipped_and_cut_off(tmp_path: Path) -> None:
    _journal_with_one_trial(tmp_path)
    path = tmp_path / "t1.jsonl"
    good = path.stat().st_size
    with path.open("ab") as fh:
        fh.write(b'{"metrics": {"step": 2, "val_')
    parsed = parse_lines(path, event_problem)
    assert len(parsed.lines) == 3
    assert parsed.good_bytes == good and parsed.torn_bytes == path.stat().st_size - good
    assert len(Journal(tmp_path).read()["t1"]) == 3
    assert drop_torn_tail(path, parsed) == parsed.torn_bytes
    assert path.stat().st_size == good


def test_complete_last_line_without_newline_is_kept_and_ended(tmp_path: Path) -> None:
    path = tmp_path / "t2.jsonl"
    path.write_bytes(b'{"trial": {"lr": 1}}\n{"outcome": {"status": "ok"}}')
    parsed = parse_lines(path, event_problem)
    assert parsed.needs_newline and parsed.torn_bytes == 0 and len(parsed.lines) == 2
    assert drop_torn_tail(path, parsed) == 0
    assert path.read_bytes().endswith(b'"ok"}}\n')
    journal = Journal(tmp_path)
    journal.write("t2", "metrics", {"step": 1})
    journal.close("t2")
    assert [kind for kind, _ in journal.read()["t2"]] == ["trial", "outcome", "metrics"]


def test_torn_non_utf8_tail_is_torn_not_damage(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"trial": {}}\n\xff\xfe')
    parsed = parse_lines(path, event_problem)
    assert parsed.torn_bytes == 2 and len(parsed.lines) == 1


@pytest.mark.parametrize("raw, why", [
    (b'{"trial": {}}\nnot json\n{"trial": {}}\n', "not a complete JSON line"),
    (b'{"trial": {}}\n\xff\xfe\n', "not UTF-8"),
    (b'[1, 2]\n', "not a journal event"),
    (b'{"trial": 3}\n', "holds no mapping"),
    (b'{"outcome": {"error": "x"}}\n', "without a status"),
])
def test_damage_in_a_complete_line_names_file_and_line(tmp_path: Path, raw: bytes,
                                                       why: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(raw)
    with pytest.raises(JournalDamaged) as info:
        Journal(tmp_path).read()
    err = info.value
    assert isinstance(err, SpecError) and err.exit_code == 2
    assert err.path == path and why in str(err)
    assert str(path) in err.key and "Fix:" in str(err)


def test_line_number_is_the_damaged_one(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"trial": {}}\n{"metrics": {}}\n{oops}\n')
    with pytest.raises(JournalDamaged) as info:
        parse_lines(path, event_problem)
    assert info.value.line == 3


def test_event_problem_accepts_events() -> None:
    assert event_problem({"metrics": {"step": 1}}) is None
    assert event_problem({"outcome": {"status": "error"}}) is None
    assert event_problem({"a": {}, "b": {}}) is not None


def test_journal_is_not_opened_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("")
    folder = tmp_path / "trials"
    folder.mkdir()
    (folder / "t1.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        Journal(folder).write("t1", "trial", {})
    assert target.read_text() == ""
    with pytest.raises(OSError):
        parse_lines(folder / "t1.jsonl")


def test_pickled_journal_keeps_folder_not_open_files(tmp_path: Path) -> None:
    import pickle

    journal = Journal(tmp_path)
    journal.write("t1", "trial", {})
    copy = pickle.loads(pickle.dumps(journal))
    journal.close_all()
    assert copy.folder == tmp_path and copy._files == {}
