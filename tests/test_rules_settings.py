"""RuleSettings: defaults, validation, and which checks run."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sweeps.rules import RULES, WARNINGS
from sweeps.rules.settings import CHECK_NAMES, RULE_NAMES, WARNING_NAMES, RuleSettings
from sweeps.rules.verdict import REASONS


def test_defaults_match_the_documented_table():
    s = RuleSettings()
    assert (s.enabled, s.disabled, s.window, s.smoothing) == (None, [], 200, 20)
    assert (s.blowup_ratio, s.blowup_min_history, s.grad_norm_cap) == (50.0, 5, 1e4)
    assert (s.baseline_loss, s.flat_tolerance, s.flat_patience) == (None, 0.05, 100)
    assert (s.divergence_ratio, s.divergence_patience) == (2.0, 20)
    assert (s.spike_ratio, s.spike_window, s.spike_min_history) == (10.0, 20, 5)
    assert (s.collapse_ratio, s.collapse_patience, s.collapse_min_step) == (0.1, 20, 50)
    assert (s.warmup_steps, s.lr_restart_factor, s.allow_lr_restarts) == (0, 2.0, False)
    assert (s.dead_patience, s.clip_warn_fraction, s.clip_warn_min_reports) == (50, 0.5, 20)
    assert s.allow_nonfinite_grads is False


def test_every_field_is_documented():
    for name, field in RuleSettings.model_fields.items():
        assert field.description, name


def test_rule_names_are_verdict_reasons_in_priority_order():
    assert tuple(RULES) == RULE_NAMES
    assert RULE_NAMES[0] == "non_finite"
    assert set(RULE_NAMES) <= set(REASONS)
    assert tuple(WARNINGS) == WARNING_NAMES
    assert not set(WARNING_NAMES) & set(REASONS)


def test_every_failure_reason_has_a_colour_of_its_own():
    """The plots colour outcomes by reason: a new reason gets its own colour, not grey."""
    from sweeps.results.plots import OUTCOME_COLOURS

    assert set(REASONS) <= set(OUTCOME_COLOURS)
    assert len(set(OUTCOME_COLOURS.values())) == len(OUTCOME_COLOURS)


def test_default_runs_every_failure_rule_and_no_warning():
    s = RuleSettings()
    assert s.active_rules() == RULE_NAMES
    assert s.active_warnings() == ()


def test_enabled_is_the_exact_list_and_disabled_wins():
    s = RuleSettings(enabled=["lr_anomaly", "non_finite", "dead_gradient"], disabled=["lr_anomaly"])
    assert s.active_rules() == ("non_finite",)
    assert s.active_warnings() == ("dead_gradient",)
    assert RuleSettings(disabled=["loss_spike"]).active_rules() == tuple(
        n for n in RULE_NAMES if n != "loss_spike"
    )


@pytest.mark.parametrize("field", ["enabled", "disabled"])
def test_unknown_check_name_is_rejected_with_the_known_names(field):
    with pytest.raises(ValidationError) as err:
        RuleSettings(**{field: ["nan_rule"]})
    assert "nan_rule" in str(err.value) and "non_finite" in str(err.value)


def test_unknown_key_is_rejected():
    with pytest.raises(ValidationError, match="blowup_ratoi"):
        RuleSettings(blowup_ratoi=10)


@pytest.mark.parametrize(
    "bad",
    [
        {"blowup_ratio": 1.0},
        {"spike_ratio": 0},
        {"divergence_ratio": -2},
        {"lr_restart_factor": 1},
        {"collapse_ratio": 0},
        {"collapse_ratio": 1.5},
        {"flat_tolerance": 0},
        {"flat_tolerance": 1},
        {"baseline_loss": 0},
        {"grad_norm_cap": -1},
        {"flat_patience": 0},
        {"collapse_patience": 0},
        {"divergence_patience": 1},
        {"dead_patience": 0},
        {"warmup_steps": -1},
        {"window": 5},
        {"smoothing": 0},
        {"clip_warn_fraction": 1.0},
    ],
)
def test_out_of_range_values_are_rejected(bad):
    with pytest.raises(ValidationError):
        RuleSettings(**bad)


def test_a_window_too_small_for_a_patience_names_both_keys():
    with pytest.raises(ValidationError, match="collapse_patience.*window"):
        RuleSettings(window=50, collapse_patience=60)
    with pytest.raises(ValidationError, match="spike_min_history"):
        RuleSettings(spike_window=3, spike_min_history=4)
    RuleSettings(window=60, collapse_patience=60, dead_patience=40)  # fits
    RuleSettings(window=40, dead_patience=50)  # dead_gradient is off: no need to fit
    with pytest.raises(ValidationError, match="dead_patience"):
        RuleSettings(window=40, dead_patience=50, enabled=["dead_gradient"])


def test_yaml_style_mapping_round_trips():
    raw = {"baseline_loss": 1.5708, "flat_patience": 200, "enabled": list(CHECK_NAMES)}
    s = RuleSettings.model_validate(raw)
    assert RuleSettings.model_validate(s.model_dump()) == s
    assert s.active_warnings() == WARNING_NAMES


def test_a_warmup_below_1_is_a_share_of_the_steps(linreg_dir):
    """A fractional warmup knob (a Hugging Face ``warmup_steps`` below 1, as
    ``warmup_ratio`` was) ends at that share of ``budget.max_steps``; a count is steps."""
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.run import trial_settings
    from tests.conftest import edit_linreg

    edit_linreg(linreg_dir, new_keys=True,
                search_space={"warmup": {"type": "uniform", "low": 0.0, "high": 0.3}},
                write_back={"warmup": "train.warmup"},
                budget={"trials": 4, "max_steps": 200})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    assert trial_settings(sweep, {"warmup": 0.15}).warmup_steps == 30
    assert trial_settings(sweep, {"warmup": 40}).warmup_steps == 40
    assert trial_settings(sweep, {"warmup": 0.0}).warmup_steps == 0


def test_a_declared_quality_baseline_reaches_the_rules(linreg_dir):
    """The first objective's declared ``baseline`` is what flat_at_baseline reads beside the
    loss; an objective without one (its baseline defaulted) leaves the rule to the loss."""
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.run import trial_settings
    from tests.conftest import edit_linreg

    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    assert trial_settings(sweep, {}).quality_metric is None
    edit_linreg(linreg_dir, objectives=[{"metric": "val_loss", "mode": "min",
                                         "baseline": 2.0}])
    settings = trial_settings(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir), {})
    assert (settings.quality_metric, settings.quality_mode, settings.quality_baseline) == \
        ("val_loss", "min", 2.0)
