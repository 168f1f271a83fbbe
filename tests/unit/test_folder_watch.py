"""A results folder deleted or moved under a running sweep is found, and only what the
sweep wrote there since is cleared."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sweeps.state.folder_watch import FolderGone, FolderWatch, clear_remnant
from sweeps.state.layout import MARKER_FILE


def _results(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "x"
    folder.mkdir(parents=True)
    (folder / MARKER_FILE).touch()
    return folder


def test_deleted_moved_or_unmarked_is_gone(tmp_path: Path) -> None:
    folder = _results(tmp_path)
    watch = FolderWatch(folder)
    watch.check()  # as it started
    (folder / MARKER_FILE).unlink()  # an rm -rf the sweep's writes raced with
    with pytest.raises(FolderGone, match="was deleted or moved while the sweep ran"):
        watch.check()
    (folder / MARKER_FILE).touch()
    folder.rename(tmp_path / "moved")
    folder.mkdir()
    (folder / MARKER_FILE).touch()  # another folder at the same path
    assert FolderWatch(tmp_path / "moved").gone is False
    with pytest.raises(FolderGone):
        watch.check()
    shutil.rmtree(folder)
    assert watch.gone


def test_only_a_remnant_of_the_sweeps_own_writes_is_cleared(tmp_path: Path) -> None:
    remnant = tmp_path / "r"
    for name in ("ray", "trials", "confirm-2"):
        (remnant / name).mkdir(parents=True)
    (remnant / "trials" / "ab12cd34.jsonl").write_text("{}\n")
    assert clear_remnant(remnant) and not remnant.exists()
    mine = tmp_path / "m"
    (mine / "trials").mkdir(parents=True)
    (mine / "notes.txt").write_text("the user's")
    assert not clear_remnant(mine) and (mine / "notes.txt").exists()
    marked = _results(tmp_path)
    (marked / "trials").mkdir()
    assert not clear_remnant(marked) and marked.exists()
