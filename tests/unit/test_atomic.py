"""Atomic writes: the old file or the new one, never half of one, and no litter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sweeps.state.atomic import replace_dir, write_text


def _litter(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_write_text_creates_parents_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.txt"
    write_text(path, "one")
    write_text(path, "two")
    assert path.read_text() == "two"
    assert _litter(path.parent) == []


def test_written_file_is_shareable_under_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    write_text(path, "old")
    with pytest.raises(UnicodeEncodeError):
        write_text(path, "bad \udcff surrogate")
    assert path.read_text() == "old"
    assert _litter(tmp_path) == []


def test_replace_dir_swaps_whole(tmp_path: Path) -> None:
    target = tmp_path / "plots"
    replace_dir(target, lambda d: (d / "old.png").write_text("1"))
    replace_dir(target, lambda d: (d / "new.png").write_text("2"))
    assert sorted(p.name for p in target.iterdir()) == ["new.png"]
    assert _litter(tmp_path) == []


def test_replace_dir_failure_keeps_the_old_directory(tmp_path: Path) -> None:
    target = tmp_path / "plots"
    replace_dir(target, lambda d: (d / "old.png").write_text("1"))

    def fill(d: Path) -> None:
        (d / "half.png").write_text("x")
        raise RuntimeError("plotting failed")

    with pytest.raises(RuntimeError):
        replace_dir(target, fill)
    assert sorted(p.name for p in target.iterdir()) == ["old.png"]
    assert _litter(tmp_path) == []


def test_what_a_killed_write_left_is_removed_and_nothing_else(tmp_path):
    """A driver killed during the final writes left ``trials/.2116a39c.csv.dy10lddo``;
    resume removes such files (and replace_dir's ``.<name>.old``), not the folder's own."""
    from sweeps.state.atomic import remove_left_behind

    (tmp_path / "trials").mkdir()
    left = [tmp_path / "trials" / ".2116a39c.csv.dy10lddo", tmp_path / ".trials.csv.ab_12cd9",
            tmp_path / ".stable.old"]
    kept = [tmp_path / ".sweeps.owner", tmp_path / ".sweeps-seal", tmp_path / ".sweeps.lock",
            tmp_path / ".sweeps-results", tmp_path / "trials" / "a1.jsonl.interrupted",
            tmp_path / "trials.csv"]
    for path in left[:2] + kept:
        path.write_text("x")
    left[2].mkdir()
    assert sorted(remove_left_behind(tmp_path, ("trials", "stable"))) == sorted(left)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in left)
