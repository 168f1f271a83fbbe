"""Search-space knobs: validation, Optuna distributions, fixed and central values."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from pydantic import TypeAdapter, ValidationError

from sweeps.errors import SpecError
from sweeps.spec import space as sp
from tests.unit.conftest import load_linreg

KNOB = TypeAdapter(sp.Knob)


def knob(**entry: object):
    return KNOB.validate_python(entry)


def test_entries_pick_their_knob_type() -> None:
    assert isinstance(knob(type="loguniform", low=1e-4, high=1.0), sp.LogUniform)
    assert isinstance(knob(type="uniform", low=0, high=0.3), sp.Uniform)
    assert isinstance(knob(type="int", low=1, high=8), sp.IntRange)
    assert isinstance(knob(type="categorical", choices=["a", None]), sp.Categorical)
    assert isinstance(knob(type="fixed", value={"any": 1}), sp.Fixed)


@pytest.mark.parametrize("entry, message", [
    ({"type": "loguniform", "low": 0, "high": 1}, "greater than 0"),
    ({"type": "loguniform", "low": 1, "high": 0.1}, "low 1.0 exceeds high 0.1"),
    ({"type": "uniform", "low": 2, "high": 1}, "low 2.0 exceeds high 1.0"),
    ({"type": "int", "low": 0, "high": 8, "log": True}, "needs low >= 1"),
    ({"type": "int", "low": 1, "high": 8, "log": True, "step": 2}, "takes no step"),
    ({"type": "int", "low": 1, "high": 8, "step": 0}, "greater than or equal to 1"),
    ({"type": "categorical", "choices": []}, "at least 1 item"),
    ({"type": "categorical", "choices": [0, 1.0, 1]}, "1 is listed twice"),
    ({"type": "categorical", "choices": [False, 0.0]}, "trials that ran 0.0 would be"),
    ({"type": "int", "low": 0, "high": 60, "step": 7}, "cut the range to 0..56"),
    ({"type": "int", "low": 5, "high": 12, "step": 10}, "every trial would get 5"),
    ({"type": "uniform", "low": 0, "high": 1, "log": True}, "Extra inputs"),
    ({"type": "normal", "low": 0, "high": 1}, "does not match any of the expected tags"),
])
def test_bad_entries_are_refused(entry: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KNOB.validate_python(entry)


def test_bad_knob_in_a_sweep_file_is_a_spec_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_linreg(tmp_path, search_space={"lr": {"type": "loguniform", "low": 1.0,
                                                   "high": 0.1}})
    assert "search_space.lr" in info.value.key and info.value.exit_code == 2


def test_distributions_and_fixed_knobs() -> None:
    space = {"lr": knob(type="loguniform", low=1e-4, high=1.0),
             "layers": knob(type="int", low=2, high=10, step=2),
             "opt": knob(type="categorical", choices=["adam"]),
             "wd": knob(type="fixed", value=0.1)}
    dists = sp.optuna_space(space)
    assert dists == {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True),
                     "layers": optuna.distributions.IntDistribution(2, 10, step=2)}
    assert sp.fixed_values(space) == {"opt": "adam", "wd": 0.1}
    with pytest.raises(ValueError, match="not fixed"):
        sp.fixed_value(space["lr"])


def test_central_values() -> None:
    assert sp.central_value(knob(type="loguniform", low=1e-4, high=1.0)) == pytest.approx(1e-2)
    assert sp.central_value(knob(type="uniform", low=0, high=0.3)) == pytest.approx(0.15)
    assert sp.central_value(knob(type="int", low=1, high=10, step=3)) == 4
    assert sp.central_value(knob(type="categorical", choices=["b", "a"])) == "b"
    assert sp.central_value(knob(type="fixed", value=7)) == 7


@pytest.mark.parametrize("entry, inside, outside", [
    ({"type": "loguniform", "low": 1e-4, "high": 1.0}, [1e-4, 0.5, 1.0],
     [0, -1.0, 2.0, "0.5", True, math.nan]),
    ({"type": "uniform", "low": 0.0, "high": 0.3}, [0.0, 0.3, 0], [0.31, -0.1]),
    ({"type": "int", "low": 2, "high": 10, "step": 2}, [2, 4, 10], [3, 12, 0]),
    ({"type": "categorical", "choices": ["a", None]}, ["a", None], ["b", 1]),
    ({"type": "categorical", "choices": ["only"]}, ["only"], ["other"]),
    ({"type": "fixed", "value": 0.1}, [0.1], [0.2]),
])
def test_contains(entry: dict, inside: list, outside: list) -> None:
    k = knob(**entry)
    assert all(sp.contains(k, v) for v in inside), inside
    assert not any(sp.contains(k, v) for v in outside), outside


@pytest.mark.parametrize(("knob", "entry", "key", "bound"), [
    ("lr", {"type": "uniform", "low": -0.01, "high": 0.5}, "search_space.lr.low", "> 0"),
    ("lr", {"type": "categorical", "choices": [0.1, 0]}, "search_space.lr.choices", "> 0"),
    ("lr", 0.0, "search_space.lr", "> 0"),
    ("weight_decay", {"type": "uniform", "low": -0.1, "high": 0.1},
     "search_space.weight_decay.low", ">= 0"),
    ("dropout", {"type": "uniform", "low": 0.0, "high": 1.5}, "search_space.dropout.high",
     "in [0, 1]"),
    ("momentum", {"type": "uniform", "low": -0.5, "high": 0.99},
     "search_space.momentum.low", "in [0, 1]"),
])
def test_a_default_knob_outside_its_values_is_refused(tmp_path: Path, knob: str, entry: object,
                                                      key: str, bound: str) -> None:
    """A uniform LR from -0.01 passed every check and crashed the trials drawn below 0
    (``Invalid learning rate``); the bound is named instead."""
    with pytest.raises(SpecError) as info:
        load_linreg(tmp_path, search_space={knob: entry}, write_back={knob: "train.lr"})
    assert info.value.key == key and info.value.exit_code == 2
    assert f"{knob} must be {bound}" in str(info.value)


def test_a_default_knob_at_the_edge_of_its_values_is_taken(tmp_path: Path) -> None:
    sweep = load_linreg(tmp_path, search_space={
        "dropout": {"type": "uniform", "low": 0.0, "high": 1.0},
        "grad_clip": {"type": "categorical", "choices": [0, 1.0]}},
        write_back={"dropout": "train.dropout", "grad_clip": "train.grad_clip"},
        new_keys=True)
    assert {"dropout", "grad_clip"} <= set(sweep.space)


@pytest.mark.parametrize(("path", "hint"), [
    ("model.lr", "did you mean 'train.lr'?"),            # the same last key elsewhere
    ("train.learning_rate", "did you mean 'train.lr'?"),  # another name of the knob
    ("train.lrr", "did you mean 'train.lr'?"),            # a typo
])
def test_a_missing_write_back_path_names_the_value_the_knob_meant(tmp_path: Path, path: str,
                                                                  hint: str) -> None:
    with pytest.raises(SpecError) as info:
        load_linreg(tmp_path, write_back={"lr": path})
    assert info.value.key == "write_back.lr" and hint in str(info.value)


def test_a_missing_write_back_path_is_not_offered_another_knobs_value(tmp_path: Path) -> None:
    """``train.dropout`` missing was offered ``train.lr``, the LR's own path."""
    with pytest.raises(SpecError) as info:
        load_linreg(tmp_path, search_space={"dropout": {"type": "uniform", "low": 0.0,
                                                        "high": 0.3}},
                    write_back={"dropout": "train.dropout"})
    assert info.value.key == "write_back.dropout" and "did you mean" not in str(info.value)


def test_a_flat_window_no_trial_can_fill_is_noted(tmp_path: Path) -> None:
    """flat_patience 100 after a warmup of 5 in 100-step trials: a run at the random guess
    ended ok and nothing flagged it (a config at val_mse 1.01 against a guess of 1)."""
    sweep = load_linreg(tmp_path / "short", rules={"flat_patience": 100},
                        budget={"trials": 4, "max_steps": 100})
    note = next(n for n in sweep.notes if n.startswith("rules.flat_patience"))
    assert "(100) is not below budget.max_steps (100): flat_at_baseline can never fire" in note
    assert "e.g. 50" in note
    roomy = load_linreg(tmp_path / "roomy", rules={"flat_patience": 100},
                        budget={"trials": 4, "max_steps": 300})
    assert not any(n.startswith("rules.flat_patience") for n in roomy.notes)
    off = load_linreg(tmp_path / "off", rules={"flat_patience": 100,
                                               "disabled": ["flat_at_baseline"]},
                      budget={"trials": 4, "max_steps": 100})
    assert not any(n.startswith("rules.flat_patience") for n in off.notes)
