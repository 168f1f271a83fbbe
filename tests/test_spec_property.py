"""Random mappings thrown at the loader give a clean SpecError or a valid sweep."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeps.errors import SpecError
from sweeps.spec.loader import Sweep, load_sweep_dict

KEYS = ["name", "trainer", "base_config", "search_space", "write_back", "objectives", "rules",
        "budget", "confirm", "resources", "output", "seed", "extra", "lr", "type", "low",
        "high", "choices", "trials", "max_steps", "metric", "mode", "extends", "compile"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
                        ["", "x", "a.b", "loguniform", "categorical", "min", "none",
                         "linreg_trainer:train", "lr", "train.lr", "-1", "1e-3"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)), max_leaves=12)
sweeps = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def _with_core(extra: dict) -> dict:
    base = {"name": "p", "trainer": "linreg_trainer:train",
            "search_space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0}},
            "write_back": {"lr": "train.lr"}}
    base.update(extra)
    return base


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(sweeps, sweeps.map(_with_core), values))
def test_loader_only_raises_spec_errors(data):
    folder = Path(__file__).parent / "sweepfiles"
    try:
        sweep = load_sweep_dict(data, base_dir=folder, workdir=folder)
    except SpecError as exc:
        assert exc.key and exc.problem and exc.fix
        assert "\n" not in exc.key
    else:
        assert isinstance(sweep, Sweep)
        assert set(sweep.spec.write_back) == set(sweep.space)
