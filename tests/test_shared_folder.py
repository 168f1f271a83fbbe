"""A results folder, or the root it lies in, that another user owns or can write is refused
(exit 2, naming owner and mode) before anything is written, unless --allow-shared-folder;
the owner and lock files are private, and a password in a tracking URI is never kept."""

from __future__ import annotations

import json
import os
import stat

import pytest

from sweeps.commands.cli import main
from sweeps.state import folder_lock
from sweeps.state.folder_lock import LOCK_FILE, OWNER_FILE, SharedFolder, claim, owner_text


@pytest.fixture(autouse=True)
def _strict():
    folder_lock.allow_shared(False)
    yield
    folder_lock.allow_shared(False)


def test_a_world_writable_root_is_refused_before_anything_is_written(linreg_dir, capsys,
                                                                     monkeypatch):
    monkeypatch.chdir(linreg_dir)
    shared = linreg_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user's "shared" root, no sticky bit
    assert main(["run", "linreg.yaml", "--output", str(shared), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "results root another user could change" in err and "mode 0777" in err
    assert "--allow-shared-folder" in err
    assert list(shared.iterdir()) == [], "nothing created in it"
    shared.chmod(0o1777)  # sticky: nobody else may rename what is in it
    with claim(shared / "linreg", "run"):
        pass


def test_a_folder_another_user_owns_is_refused_and_its_owner_file_not_read(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a folder another user's needs root (chown)")
    folder = tmp_path / "results" / "theirs"
    folder.mkdir(parents=True)
    (folder / ".sweeps-results").write_text("marker\n")
    (folder / OWNER_FILE).write_text(json.dumps({"command": "run", "pid": 1, "host": "h",
                                                 "started": "now", "argv": "\x1b[2J forged"}))
    os.chown(folder / OWNER_FILE, 4242, 4242)
    os.chown(folder, 4242, 4242)
    with pytest.raises(SharedFolder) as caught:
        with claim(folder, "run"):
            pass
    assert "it belongs to uid 4242 (mode 0755)" in str(caught.value)
    assert not (folder / LOCK_FILE).exists()
    assert "forged" not in owner_text(folder) and "is not read" in owner_text(folder)
    folder_lock.allow_shared(True)
    with claim(folder, "run"):
        pass


def test_owner_and_lock_files_are_private_and_hold_no_password(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["sweeps", "run", "s.yaml", "--tracking-uri",
                                     "http://alice:S3cretPW@mlflow.example:5000/"])
    folder = tmp_path / "results" / "mine"
    with claim(folder, "run"):
        for name in (OWNER_FILE, LOCK_FILE):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
        text = (folder / OWNER_FILE).read_text()
        assert "S3cretPW" not in text and "http://alice:***@mlflow.example:5000/" in text
    monkeypatch.setattr("sys.argv", ["sweeps", "run", "s.yaml", "--tracking-uri",
                                     "http://alice:p@ss@127.0.0.1:9/?token=QS3cret&x=1"])
    with claim(folder, "run"):
        text = (folder / OWNER_FILE).read_text()
        assert "p@ss" not in text and "ss@" not in text and "QS3cret" not in text
        assert "http://alice:***@127.0.0.1:9/?token=***&x=1" in text
