"""``budget.sampler``: the TPE the search asks (no Ray: the sampler alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.errors import SpecError
from sweeps.tune.searcher import make_sampler
from tests.unit.conftest import load_linreg


def test_the_default_models_the_knobs_jointly_and_tpe_is_optunas_default(tmp_path: Path):
    joint = make_sampler(load_linreg(tmp_path / "a", budget={"trials": 24, "concurrent": 2}))
    plain = make_sampler(load_linreg(tmp_path / "b", budget={"sampler": "tpe"}))
    # Optuna's own settings (its attributes: what TPESampler was built with)
    assert (joint._multivariate, joint._n_startup_trials, joint._constant_liar) == \
        (True, 6, True)
    assert (plain._multivariate, plain._n_startup_trials, plain._constant_liar) == \
        (None, 10, True)  # None: joint for one objective, knob by knob for several


def test_an_unknown_sampler_is_bad_input(tmp_path: Path):
    with pytest.raises(SpecError) as err:
        load_linreg(tmp_path, budget={"sampler": "random"})
    assert "budget.sampler" in err.value.key
