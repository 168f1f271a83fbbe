"""The package API: evaluate, warnings, priority, no false alarms, cost, properties."""

from __future__ import annotations

import doctest
import importlib
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweeps.rules import RULES, evaluate, warnings
from sweeps.rules.settings import CHECK_NAMES, RULE_NAMES, RuleSettings
from sweeps.rules.verdict import REASONS, Verdict

ALL = RuleSettings(enabled=list(CHECK_NAMES), baseline_loss=1.5, warmup_steps=20)


def healthy_run(seed: int, steps: int = 400, warmup: int = 20) -> list[dict]:
    """Loss 1.5 exp(-t/150) + 0.05 noise, lognormal grad norms, warmup then cosine LR."""
    rng = np.random.default_rng(seed)
    history = []
    for t in range(steps):
        if t < warmup:
            lr = 1e-3 * t / warmup
        else:
            lr = 5e-4 * (1 + math.cos(math.pi * (t - warmup) / (steps - warmup)))
        report = {
            "step": t,
            "loss": 1.5 * math.exp(-t / 150) + 0.05 * rng.standard_normal(),
            "grad_norm": float(rng.lognormal(0.0, 0.5)),
            "lr": lr,
            "pred_std": 0.8 + 0.05 * rng.standard_normal(),
            "target_std": 1.0,
            "nonfinite_grads": 0,
            "dead_params": 0,
            "clipped": float(rng.random() < 0.3),
        }
        if t % 50 == 49:
            report["val_loss"] = 1.5 * math.exp(-t / 150) + 0.1
        history.append(report)
    return history


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "rule_settings",
    [RuleSettings(), RuleSettings(warmup_steps=20), ALL],
    ids=["defaults", "warmup", "all-with-baseline"],
)
def test_no_false_alarm_at_any_prefix_of_a_healthy_run(seed, rule_settings):
    history = healthy_run(seed)
    for k in range(1, len(history) + 1):
        assert evaluate(history[:k], rule_settings) is None, k
        assert warnings(history[:k], rule_settings) == [], k


@pytest.mark.parametrize("name", RULE_NAMES)
def test_each_rule_alone_stays_quiet_on_a_healthy_run(name):
    history = healthy_run(42)
    for k in range(1, len(history) + 1):
        assert RULES[name](history[:k], ALL) is None, (name, k)


def test_priority_non_finite_first():
    history = [{"step": t, "loss": 1.0, "grad_norm": 1.0} for t in range(10)]
    history.append({"step": 10, "loss": math.nan, "grad_norm": 1e9})
    assert evaluate(history).reason == "non_finite"
    assert evaluate(history, RuleSettings(disabled=["non_finite"])).reason == "grad_blowup"
    assert evaluate(history, RuleSettings(enabled=["collapse"])) is None


def test_empty_history():
    assert evaluate([]) is None
    assert warnings([]) == []


def test_cost_is_bounded_by_the_window():
    """No timing assertion: prints the cost of one evaluate per report of a 400-step run."""
    for steps in (400, 4000):
        history = healthy_run(0, steps=steps)
        start = time.perf_counter()
        for _ in range(400):
            evaluate(history, ALL)  # the full history each time: cost must not grow with it
        elapsed = (time.perf_counter() - start) * 1e3
        print(f"\n400 evaluate calls, {steps}-report history, all checks: {elapsed:.1f} ms")
        assert evaluate(history, ALL) is None


@pytest.mark.parametrize(
    "module",
    [
        "sweeps.rules",
        "sweeps.rules.settings",
        *(f"sweeps.rules.{name}" for name in RULE_NAMES),
        "sweeps.rules.dead_gradient",
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


# -- properties ------------------------------------------------------------------------

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)
positive = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)


@st.composite
def finite_histories(draw) -> list[dict]:
    n = draw(st.integers(1, 80))
    history = []
    for t in range(n):
        report: dict = {"step": t}
        for key, values in (("loss", finite), ("grad_norm", positive), ("val_loss", finite)):
            if draw(st.booleans()):
                report[key] = draw(values)
        report["nonfinite_grads"] = 0
        history.append(report)
    return history


@given(finite_histories())
@settings(max_examples=200, deadline=None)
def test_finite_histories_never_make_non_finite_fire(history):
    for k in range(1, len(history) + 1):
        assert RULES["non_finite"](history[:k], RuleSettings()) is None


@given(finite_histories(), st.sampled_from([math.nan, math.inf, -math.inf]), st.data())
@settings(max_examples=200, deadline=None)
def test_a_non_finite_last_loss_is_always_non_finite_at_that_step(history, bad, data):
    history[-1]["loss"] = bad
    disabled = data.draw(st.lists(st.sampled_from(RULE_NAMES[1:]), unique=True))
    verdict = evaluate(history, RuleSettings(disabled=disabled))
    assert verdict is not None
    assert verdict.reason == "non_finite" and verdict.step == history[-1]["step"]


junk = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**400), 10**400),
    st.booleans(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)
KEYS = ["loss", "grad_norm", "lr", "val_loss", "pred_std", "target_std"]
KEYS += ["nonfinite_grads", "dead_params", "clipped", "other"]


@given(
    st.lists(st.dictionaries(st.sampled_from(KEYS), junk, max_size=6), min_size=1, max_size=60),
    st.integers(0, 5),
)
@settings(max_examples=300, deadline=None)
def test_any_history_is_judged_without_raising_at_the_newest_step(reports, warmup):
    history = [{"step": t, **r} for t, r in enumerate(reports)]
    rule_settings = RuleSettings(
        enabled=list(CHECK_NAMES),
        baseline_loss=1.0,
        warmup_steps=warmup,
        window=20,
        smoothing=3,
        divergence_patience=4,
        flat_patience=5,
        spike_window=5,
        blowup_min_history=2,
        collapse_patience=3,
        dead_patience=3,
        clip_warn_min_reports=3,
    )
    verdict = evaluate(history, rule_settings)
    if verdict is not None:
        assert isinstance(verdict, Verdict) and verdict.reason in REASONS
        assert verdict.step == history[-1]["step"]
        verdict.summary()
    for warning in warnings(history, rule_settings):
        assert warning["step"] == history[-1]["step"]


@given(
    st.lists(positive, min_size=6, max_size=60),
    st.integers(min_value=-10, max_value=10).map(lambda k: 2.0 ** k),
)
@settings(max_examples=200, deadline=None)
def test_ratio_rules_do_not_depend_on_the_loss_and_grad_scale(values, scale):
    """Scaled by a power of two, every value and ratio is scaled exactly: another factor
    rounds a ratio that sits on a threshold to either side of it (1e-5 / 1.0000000000000002e-6
    is 9.999999999999998, x 33 it is 10.0)."""
    no_cap = RuleSettings(grad_norm_cap=None)
    history = [{"step": t, "loss": v, "grad_norm": v} for t, v in enumerate(values)]
    scaled = [{"step": t, "loss": v * scale, "grad_norm": v * scale} for t, v in enumerate(values)]
    for name in ("grad_blowup", "loss_spike", "divergence"):
        plain, big = RULES[name](history, no_cap), RULES[name](scaled, no_cap)
        assert (plain is None) == (big is None), name
