"""`sweeps resume` and `sweeps audit` load code only from folders this account's sweeps
wrote, in that very folder, that no other user can change; the check runs before anything
in the folder is read or written."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from sweeps.commands.cli import main
from sweeps.errors import SpecError
from sweeps.state.seal import SEAL_FILE, check, seal


def _results_folder(tmp_path):
    folder = tmp_path / "results" / "handed-over"
    (folder / "ray").mkdir(parents=True)
    (folder / "ray" / "tuner.pkl").write_bytes(b"not a real pickle")
    (folder / ".sweeps-results").write_text("marker\n")
    (folder / "sweep.yaml").write_text("name: handed-over\n")
    (folder / "sweep_state.json").write_text('{"source": "", "base_dir": "/", "workdir": "/"}')
    return folder


def test_a_sealed_folder_passes_and_moves_with_its_seal(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = _results_folder(tmp_path)
    seal(folder)
    assert (folder / SEAL_FILE).stat().st_mode & 0o077 == 0, "the seal is private"
    assert (tmp_path / "config" / "sweeps" / "state.key").stat().st_mode & 0o077 == 0
    check(folder)
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    check(moved)


def test_a_folder_sealed_under_another_key_or_writable_by_others_is_refused(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "theirs"))
    folder = _results_folder(tmp_path)
    seal(folder)  # sealed by someone else's sweeps
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "mine"))
    with pytest.raises(SpecError) as info:
        check(folder)
    assert "not written by sweeps under this account" in info.value.problem
    assert "--trust-state" in info.value.fix
    check(folder, trust=True)

    seal(folder)  # now ours, but another user may write the pickled state
    os.chmod(folder / "ray" / "tuner.pkl", 0o666)
    with pytest.raises(SpecError) as info:
        check(folder)
    assert "tuner.pkl is not yours alone" in info.value.problem
    os.chmod(folder / "ray" / "tuner.pkl", 0o644)
    journal = folder / "trials" / "t1.jsonl"  # what stable/ is rebuilt from
    journal.parent.mkdir()
    journal.write_text("{}\n")
    os.chmod(journal, 0o666)
    with pytest.raises(SpecError) as info:
        check(folder)
    assert "t1.jsonl is not yours alone" in info.value.problem


def test_the_fix_quotes_a_folder_with_a_space(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = _results_folder(tmp_path / "my results")
    with pytest.raises(SpecError) as info:
        check(folder)  # never sealed here
    assert f"`sweeps resume '{folder}' --trust-state`" in info.value.fix


def test_a_umask_002_folder_passes_unless_its_group_has_other_members(tmp_path,
                                                                      monkeypatch):
    """A user-private group (what a ``umask 002`` account writes with) is the user's own;
    a group with other members is not."""
    from sweeps.state import folder_lock

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    old = os.umask(0o002)
    try:
        folder = _results_folder(tmp_path)
        seal(folder)
    finally:
        os.umask(old)
    pickled = folder / "ray" / "tuner.pkl"
    assert pickled.stat().st_mode & 0o020, "written group-writable, as umask 002 does"
    folder_lock.group_is_mine_alone.cache_clear()
    if not folder_lock.group_is_mine_alone(pickled.stat().st_gid):
        pytest.skip("this account's group has other members")
    check(folder)
    # the group gains a member (cannot be caused here without adding a user)
    monkeypatch.setattr(folder_lock, "group_is_mine_alone", lambda gid: False)
    with pytest.raises(SpecError) as info:
        check(folder)
    assert "is not yours alone" in info.value.problem


def test_resume_refuses_an_unsealed_folder_before_ray_starts(tmp_path, monkeypatch, capsys):
    import ray

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = _results_folder(tmp_path)
    before = sorted(p.name for p in folder.rglob("*"))
    assert main(["resume", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"no {SEAL_FILE} that verifies here" in err and "--trust-state" in err
    assert not ray.is_initialized()
    assert (folder / "ray" / "tuner.pkl").read_bytes() == b"not a real pickle"
    assert sorted(p.name for p in folder.rglob("*")) == before, "nothing created"


def _digest(folder):
    def content(p):
        if p.is_symlink():
            return os.readlink(p)
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""

    return {p.relative_to(folder).as_posix(): (p.lstat().st_mode, content(p))
            for p in sorted(folder.rglob("*"))}


def test_a_copied_seal_does_not_vouch_for_another_folder(tmp_path, monkeypatch):
    """A folder shared once (a tarball sent away and back) or a seal copied into a planted
    folder: the seal binds to the folder it was made in and to its sweep.yaml."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    mine = _results_folder(tmp_path)
    seal(mine)
    planted = tmp_path / "planted"
    shutil.copytree(mine, planted)  # every byte the same, the seal included
    with pytest.raises(SpecError) as info:
        check(planted)
    assert "not in this folder" in info.value.problem
    (mine / "sweep.yaml").write_text("name: handed-over\ntrainer: evil:train\n")
    with pytest.raises(SpecError) as info:
        check(mine)  # sweep.yaml names the trainer: changed behind the seal's back
    assert "sweep.yaml in" in info.value.problem and "changed since the sweep ran" in \
        info.value.problem, "named as the edit it is, not as someone else's folder"
    assert "--trust-state" not in info.value.fix and "--warm-start" in info.value.fix
    with pytest.raises(SpecError) as info:
        check(mine, command="audit")
    assert "sweeps audit" in info.value.fix and "resume" not in info.value.fix


def test_a_refused_resume_leaves_the_folder_byte_identical(tmp_path, monkeypatch, capsys):
    """A journal with a torn last line, Optuna's journal lock: a refused resume neither
    repairs, deletes, nor writes its own lock and owner files into the folder."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = _results_folder(tmp_path)
    (folder / "trials").mkdir()
    (folder / "trials" / "abc.jsonl").write_text('{"trial": {"role": "search"}}\n{"torn')
    (folder / "optuna.journal").write_text("")
    os.symlink("nowhere", folder / "optuna.journal.lock")
    before = _digest(folder)
    assert main(["resume", str(folder), "--quiet"]) == 2
    assert "--trust-state" in capsys.readouterr().err
    assert _digest(folder) == before


def test_a_home_that_cannot_be_written_leaves_the_folder_unsealed_not_the_run(tmp_path,
                                                                             monkeypatch):
    blocked = tmp_path / "config"
    blocked.write_text("a file where the config folder would be")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocked))
    folder = _results_folder(tmp_path)
    why = seal(folder)
    assert why and str(blocked) in why
    assert not (folder / SEAL_FILE).exists()
    with pytest.raises(SpecError):
        check(folder)
