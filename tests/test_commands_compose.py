"""``try``, ``validate``, ``preflight``, ``run``, ``stability`` and ``resume`` compose in any
order on one sweep file: none leaves anything in the results folder that another refuses
(a newcomer runs ``try`` first, with a compiled model, and then ``run``)."""

from __future__ import annotations

import pytest

from tests.conftest import copy_sweepfiles, edit_linreg, run_cli_in

pytestmark = pytest.mark.slow

ARGS = {
    "try": ["try", "linreg.yaml", "--steps", "3"],
    "validate": ["validate", "linreg.yaml"],
    "preflight": ["preflight", "linreg.yaml"],
    "run": ["run", "linreg.yaml", "--quiet"],
    "stability": ["stability", "linreg.yaml", "--param", "lr", "--values", "0.01,0.1",
                  "--seeds", "1", "--steps", "10"],
    "resume": ["resume", "results/linreg"],
}
README_ORDER = ["try", "validate", "preflight", "run", "stability", "resume"]


@pytest.mark.parametrize("order", [README_ORDER, README_ORDER[::-1]],
                         ids=["readme-order", "reverse"])
def test_every_command_works_after_every_other(tmp_path, ray_session, capsys, order):
    folder = copy_sweepfiles(tmp_path)
    edit_linreg(folder, train={"compile": "default"},  # try compiles: an inductor cache
                budget={"trials": 2, "max_steps": 20, "concurrent": 2},
                confirm={"seeds": 0, "lr_probe": 0})
    ran_before = set()
    for command in order:
        code = run_cli_in(folder, *ARGS[command])
        err = capsys.readouterr().err
        assert "not a sweeps results folder" not in err, (command, ran_before, err)
        if command == "resume" and "run" not in ran_before:  # nothing to resume yet
            assert code == 2 and "holds no sweep to resume" in err, err
        else:
            assert code == 0, (command, ran_before, err)
        ran_before.add(command)
    results = folder / "results" / "linreg"
    assert (results / "trials.csv").exists() and (results / "stability").is_dir()
    assert not (results / "inductor_cache").exists() or (results / ".sweeps-results").exists()
