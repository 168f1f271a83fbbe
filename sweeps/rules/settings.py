"""What the user writes under ``rules:`` in a sweep file: every threshold, with its default."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sweeps.rules.verdict import RULE_REASONS

#: Failure rules, in priority order (the first one that fires names the failure).
RULE_NAMES: tuple[str, ...] = RULE_REASONS
#: Warning-level checks: reported, never stop a trial, off unless listed in ``enabled``.
WARNING_NAMES: tuple[str, ...] = ("dead_gradient", "frequent_clipping")
#: Every name ``enabled`` and ``disabled`` accept.
CHECK_NAMES: tuple[str, ...] = RULE_NAMES + WARNING_NAMES


class RuleSettings(BaseModel):
    """Thresholds of the instability rules; every field is optional.

    Example:
        >>> settings = RuleSettings(baseline_loss=1.5708, disabled=["loss_spike"])
        >>> settings.active_rules()
        ('non_finite', 'grad_blowup', 'divergence', 'flat_at_baseline', 'collapse', 'lr_anomaly')
        >>> RuleSettings(enabled=[*RULE_NAMES, "dead_gradient"]).active_warnings()
        ('dead_gradient',)
    """

    model_config = ConfigDict(extra="forbid")

    # -- which checks run -------------------------------------------------------------
    enabled: list[str] | None = Field(
        None,
        description="The checks to run (rule and warning names). None runs every failure "
        "rule and no warning; a list runs exactly the checks it names.",
    )
    disabled: list[str] = Field(
        default_factory=list, description="Checks not to run, applied after `enabled`."
    )
    window: int = Field(
        200,
        ge=10,
        description="How many of the newest reports a rule looks at; bounds the cost of "
        "every check and the reach of every running median and minimum.",
    )
    smoothing: int = Field(
        20,
        ge=1,
        description="Reports averaged into the smoothed loss (divergence, flat_at_baseline).",
    )

    # -- non_finite ---------------------------------------------------------------------
    allow_nonfinite_grads: bool = Field(
        False,
        description="Ignore a non-finite grad_norm / nonfinite_grads (fp16 AMP with a "
        "GradScaler skips such steps). A non-finite loss or val_loss still fails.",
    )

    # -- grad_blowup --------------------------------------------------------------------
    blowup_ratio: float = Field(
        50.0,
        gt=1,
        description="Fail when grad_norm exceeds this many times the running median of "
        "the earlier grad norms in the window.",
    )
    blowup_min_history: int = Field(
        5, ge=1, description="Earlier finite grad norms needed before the ratio is judged."
    )
    grad_norm_cap: float | None = Field(
        1e4,
        gt=0,
        description="Fail when grad_norm exceeds this absolute value, whatever the history. "
        "None turns the cap off.",
    )

    # -- flat_at_baseline ---------------------------------------------------------------
    baseline_loss: float | None = Field(
        None,
        gt=0,
        description="The loss of a random / constant prediction (pi/2 for an angular loss, "
        "the target variance for MSE, ln(classes) for cross-entropy). None turns "
        "flat_at_baseline off.",
    )
    flat_tolerance: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Relative band around the baseline: flat means "
        "|smoothed loss - baseline| <= flat_tolerance * baseline.",
    )
    flat_patience: int = Field(
        100,
        ge=1,
        description="Steps (the `step` key, not reports) the smoothed loss must stay in "
        "the band, counted after warmup_steps.",
    )
    quality_metric: str | None = Field(
        None,
        description="The quality objective's metric when the sweep file declares its "
        "`baseline` (sweeps.trial.run fills it with quality_mode and quality_baseline): "
        "flat_at_baseline does not fire while the mean of its newest 3 values is better than that "
        "baseline by more than flat_tolerance x |baseline| (the model learns though its "
        "loss sits at the random guess).",
    )
    quality_mode: Literal["min", "max"] | None = Field(
        None, description="The quality objective's mode (sweeps fills it).")
    quality_baseline: float | None = Field(
        None, description="The quality objective's declared random-guess value (sweeps "
        "fills it).")
    flat_min_progress: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="flat_at_baseline fires only when the loss's least-squares drop over "
        "the patience window, plus one standard error, is below this share of "
        "baseline_loss: a loss in the band that may be falling faster is a slow learner, "
        "not stuck.",
    )

    # -- divergence ---------------------------------------------------------------------
    divergence_ratio: float = Field(
        2.0,
        gt=1,
        description="Fail when the smoothed loss exceeds this many times its reference (the "
        "lowest smoothed loss in the window, the smoothed loss at the start of the run, "
        "or baseline_loss) while rising.",
    )
    explosion_factor: float | None = Field(
        10.0,
        gt=1,
        description="divergence fails at once, with no history needed, when the loss "
        "reaches this many times baseline_loss or the run's first loss (within the run's "
        "first 6 losses: on two losses in a row, so a one-step jump the next loss takes "
        "back trains on). None turns the explosion check off.",
    )
    divergence_patience: int = Field(
        20,
        ge=2,
        description="Reports over which the smoothed loss must have been rising: it is "
        "higher than this many reports ago and rose on at least 3/4 of them.",
    )

    # -- loss_spike ---------------------------------------------------------------------
    spike_ratio: float = Field(
        10.0,
        gt=1,
        description="Fail when one report's loss is more than spike_ratio - 1 scales above "
        "the median of the previous spike_window losses (scale: |median|, or their range "
        "when larger; for a settled positive loss, loss > spike_ratio x median).",
    )
    spike_window: int = Field(
        20, ge=1, description="Previous losses whose median is the spike reference."
    )
    spike_min_history: int = Field(
        5, ge=1, description="Previous finite losses needed before spikes are judged."
    )

    # -- collapse -----------------------------------------------------------------------
    collapse_ratio: float = Field(
        0.1,
        gt=0,
        le=1,
        description="Collapsed means pred_std / target_std below this ratio.",
    )
    collapse_patience: int = Field(
        20,
        ge=1,
        description="Consecutive reports carrying pred_std and target_std that must all "
        "be collapsed.",
    )
    collapse_min_step: int = Field(
        50, ge=0, description="Reports before this step are never counted as collapsed: a "
        "freshly initialised model often predicts nearly the same value for every input "
        "for its first few dozen steps. The runner raises it to the end of warmup."
    )

    # -- lr_anomaly ---------------------------------------------------------------------
    warmup_steps: int = Field(
        0,
        ge=0,
        description="LR warmup length in steps (sweeps.trial.run fills it from the trial config). "
        "LR rises and zeros before it are not judged, and flat_patience counts after it.",
    )
    sampled_lr: float | None = Field(
        None,
        gt=0,
        description="The trial's LR as the trainer receives it (sweeps.trial.run fills it from "
        "the lr knob, times the LR probe's scale). None (no lr knob) skips climbs_past_lr.",
    )
    lr_restart_factor: float = Field(
        2.0,
        gt=1,
        description="Fail when the LR, after it started to decay, rises above this many "
        "times its lowest value since (an unintended warm restart), or after warmup rises "
        "above this many times the larger of sampled_lr and the LR at the end of warmup.",
    )
    allow_lr_restarts: bool = Field(
        False, description="Accept LR rises after warmup: warm restarts, cyclic schedules, "
        "an LR climbing past the sampled one (skips warm_restart and climbs_past_lr; "
        "divergence judges no climb within smoothing + divergence_patience reports after "
        "the LR rose, the loss bump a restart brings).",
    )

    # -- warnings -----------------------------------------------------------------------
    dead_patience: int = Field(
        50,
        ge=1,
        description="dead_gradient warns when dead_params > 0 on this many consecutive "
        "reports carrying it.",
    )
    clip_warn_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="frequent_clipping warns when more than this fraction of the reports "
        "in the window were clipped.",
    )
    clip_warn_min_reports: int = Field(
        20, ge=1, description="Reports carrying `clipped` needed before frequent_clipping warns."
    )

    @field_validator("enabled", "disabled")
    @classmethod
    def _known_names(cls, names: list[str] | None) -> list[str] | None:
        for name in names or ():
            if name not in CHECK_NAMES:
                raise ValueError(f"unknown check {name!r}; known: {', '.join(CHECK_NAMES)}")
        return names

    @model_validator(mode="after")
    def _fits_window(self) -> RuleSettings:
        needs = {  # check -> (setting, reports it needs inside the window)
            "grad_blowup": ("blowup_min_history", self.blowup_min_history + 1),
            "divergence": (
                "smoothing + divergence_patience",
                self.smoothing + self.divergence_patience,
            ),
            "loss_spike": ("spike_window", self.spike_window + 1),
            "collapse": ("collapse_patience", self.collapse_patience),
            "dead_gradient": ("dead_patience", self.dead_patience + 1),
            "frequent_clipping": ("clip_warn_min_reports", self.clip_warn_min_reports + 1),
        }
        for check, (what, reports) in needs.items():
            if reports > self.window and self.is_enabled(check):
                raise ValueError(
                    f"{what} needs {reports} reports but window is {self.window}; "
                    f"raise window or lower {what}"
                )
        if self.spike_min_history > self.spike_window:
            raise ValueError("spike_min_history must not exceed spike_window")
        return self

    def is_enabled(self, name: str) -> bool:
        """Whether the check called ``name`` runs under these settings."""
        if name in self.disabled:
            return False
        if self.enabled is None:
            return name in RULE_NAMES
        return name in self.enabled

    def active_rules(self) -> tuple[str, ...]:
        """The failure rules that run, in priority order."""
        return tuple(name for name in RULE_NAMES if self.is_enabled(name))

    def active_warnings(self) -> tuple[str, ...]:
        """The warning-level checks that run."""
        return tuple(name for name in WARNING_NAMES if self.is_enabled(name))
