"""A wrong ``--address`` is bad input at once: Ray itself retries for many minutes, deaf to
Ctrl-C, after the results folder was claimed."""

from __future__ import annotations

import socket

import pytest

from sweeps.commands.cli import main
from sweeps.errors import SpecError
from sweeps.tune.session import check_address


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_nothing_answers_at_is_named():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        check_address(f"127.0.0.1:{port}")  # something answers: Ray's to judge
        check_address(f"ray://127.0.0.1:{port}")
    for fine in (None, "auto", "local"):
        check_address(fine)
    with pytest.raises(SpecError, match="nothing answers at 127.0.0.1:"):
        check_address(f"127.0.0.1:{_closed_port()}")
    with pytest.raises(SpecError, match="is not host:port"):
        check_address("head-node")


def test_the_jobs_api_url_is_named_as_the_wrong_address():
    """The dashboard's http:// URL (what ``sweeps submit`` takes) given to run or resume is
    named as such, with the GCS address as the fix; it used to read "nothing answers"."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        for url in (f"http://127.0.0.1:{port}", f"https://127.0.0.1:{port}"):
            with pytest.raises(SpecError, match="Jobs API's URL") as err:
                check_address(url)
            assert "GCS address host:port" in str(err.value)


@pytest.mark.parametrize("command", ["run", "resume"])
def test_run_and_resume_with_a_wrong_address_exit_2_and_touch_nothing(linreg_dir, capsys,
                                                                     monkeypatch, command):
    monkeypatch.chdir(linreg_dir)
    address = f"127.0.0.1:{_closed_port()}"
    if command == "run":
        code = main(["run", "linreg.yaml", "--address", address])
        assert not (linreg_dir / "results").exists()
    else:
        folder = linreg_dir / "done"
        folder.mkdir()
        for name in ("sweep.yaml", "sweep_state.json"):  # looks like a sweep; never read
            (folder / name).write_text("{}")
        before = sorted(p.name for p in folder.iterdir())
        code = main(["resume", str(folder), "--address", address])
        assert sorted(p.name for p in folder.iterdir()) == before
    assert code == 2
    assert "--address: nothing answers at" in capsys.readouterr().err
