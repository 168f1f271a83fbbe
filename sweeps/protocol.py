"""The names that cross module boundaries, in one place.

What a trial's status can be, which role a run plays, the keys the driver adds to
a trial's config, the keys a worker adds to its results, and the columns of
trials.csv. The writers and readers of each (the worker and the driver, the
trials.csv writer, the report and ``sweeps audit``, the tests) import them from
here. Failure reasons are the rules' own: :data:`sweeps.rules.verdict.REASONS`.

Plain strings, not an enum: they go through Ray's pickling, JSON, YAML, CSV and
MLflow tags unchanged.
"""

from __future__ import annotations

from typing import Final, Literal

# ---- trial status ---------------------------------------------------------------------
Status = Literal["running", "ok", "pruned", "unstable", "crash", "interrupted"]
RUNNING: Final = "running"  # reported, not finished
OK: Final = "ok"  # ran its steps, no rule fired
PRUNED: Final = "pruned"  # the scheduler cut it short: its quality trailed its rung
UNSTABLE: Final = "unstable"  # a rule fired
CRASH: Final = "crash"  # raised, died, hung or reported a metric that is not a number
INTERRUPTED: Final = "interrupted"  # the driver died while it ran (in the Optuna study only)
#: Statuses of a trial that failed: what the sampler is steered away from.
FAILED: Final = (UNSTABLE, CRASH)
#: Statuses of a trial that finished without failing.
FINISHED_OK: Final = (OK, PRUNED)

# ---- roles: which run of the sweep a trial is ----------------------------------------
SEARCH: Final = "search"  # a trial the search sampled
BASE: Final = "base"  # the base config's own knob values, re-run as a reference
WARM_START: Final = "warm_start"  # an earlier sweep's trial told to the sampler, not run
STABILITY: Final = "stability"  # a cell of ``sweeps stability``'s grid


def confirm_role(trial_id: str) -> str:
    """The role of a candidate's re-run on a fresh seed.

    Example:
        >>> confirm_role("3b2c870b"), probe_role("3b2c870b")
        ('confirm:3b2c870b', 'probe:3b2c870b')
    """
    return f"confirm:{trial_id}"


def probe_role(trial_id: str) -> str:
    """The role of a candidate's re-run at LR × ``confirm.lr_probe``."""
    return f"probe:{trial_id}"


# ---- keys the driver adds to a trial's config, beside the knobs ------------------------
SEED_KEY: Final = "_seed"  # the trial's seed
LR_SCALE_KEY: Final = "_lr_scale"  # LR × this inside the trial (the confirmation probe)
ROLE_KEY: Final = "_role"  # one of the roles above
RUN_KEY: Final = "_run"  # a fixed re-run's whole config, as Ray Tune's grid entry
#: an earlier sweep's best config a warm start queued first: ASHA records it, never cuts it
WARM_BEST_KEY: Final = "_warm_best"
# flat_at_baseline's patience of a fresh-seed re-run whose candidate's own search run sat at
# the random guess before it learnt (sweeps.rules.flat_at_baseline.left_band_at)
FLAT_PATIENCE_KEY: Final = "_flat_patience"

# ---- keys a worker adds to its results (beside the trainer's own metrics) -------------
RESULT_PREFIX: Final = "sweeps/"
STATUS_KEY: Final = "sweeps/status"
REASON_KEY: Final = "sweeps/reason"
STOP_STEP_KEY: Final = "sweeps/stop_step"
EVIDENCE_KEY: Final = "sweeps/evidence"
WARNING_KEY: Final = "sweeps/warning"
#: The warning of a run that ended ok with its smoothed training loss in the random-guess
#: band from its warmup on (:func:`sweeps.rules.flat_at_baseline.sat_at_guess`).
LOSS_AT_GUESS: Final = ("loss_at_guess: its training loss sat at the random guess "
                        "(rules.baseline_loss) from its warmup to its end: by its loss it "
                        "learnt nothing, whatever its quality objective read")
#: The warning of a run that ended ok with its smoothed training loss many times the random
#: guess from its warmup on (:data:`sweeps.rules.ended_ok.OFF_SCALE`): not at the guess,
#: on another scale than it.
LOSS_OFF_SCALE: Final = ("loss_off_scale: its training loss stayed many times the random "
                         "guess from its warmup to its end: it is on another scale than the "
                         "guess (summed over the batch, reduction='sum'? or rules.baseline_loss "
                         "meant for another loss), so the rules that compare the loss with "
                         "the guess cannot judge it")
#: The warning of a run that ended ok back in the random-guess band after it had learnt
#: (:func:`sweeps.rules.flat_at_baseline.back_at_guess`).
BACK_AT_GUESS: Final = ("back_at_guess: its training loss went back to the random guess "
                        "(rules.baseline_loss) after it had learnt, and ended there: it "
                        "lost what it learnt")
#: The warning of a run that ended ok with its LR still rising well past its warmup
#: (:func:`sweeps.rules.lr_anomaly.still_warming`).
LR_STILL_WARMING: Final = ("lr_still_warming: at its end, at least twice its warmup past "
                           "the start, its LR was under half the sampled lr and still rising, "
                           "or had never risen: the warmup never ended (a scheduler stepped "
                           "per epoch where it counts steps?)")
#: The warning of a run that ended ok with its quality objective last reported before its
#: last step (:func:`sweeps.rules.ended_ok.stale_quality`).
STALE_QUALITY: Final = "stale_quality"
TRACEBACK_KEY: Final = "sweeps/traceback"
FINAL_KEY: Final = "sweeps/final"  # a summary result that repeats the last report
COMPILE_KEY: Final = "sweeps/compile"  # the trial's compile evidence (JSON), when it changed
GPU_PEAK_KEY: Final = "sweeps/gpu_peak_mb"  # peak GPU memory so far (MiB), with CUDA only

# ---- Optuna: the study's constraint, and the attrs trials carry ------------------------
#: Name of the stability constraint (a failed or diagnosed trial is infeasible).
STABILITY_CONSTRAINT: Final = "stability"

# ---- trials.csv ------------------------------------------------------------------------
#: The columns every row starts with; the knobs, ``objective_<metric>`` per objective,
#: the metric summaries, ``diagnosis``, ``evidence``, compile evidence and ``warnings``
#: follow (``sweeps.results.files.trial_row``).
TRIAL_HEAD: Final = ("trial_id", "role", "status", "reason", "stop_step", "seed", "steps",
                     "retries")
#: Prefix of the columns of the objectives' values, ``objective_<metric>``.
OBJECTIVE_PREFIX: Final = "objective_"
#: Columns a judged candidate's row adds (and ``<metric>_mean``, ``_worst``, ``_spread``,
#: ``<metric>@seed<N>``).
SELECTION: Final = "selection"
SELECTION_REASON: Final = "selection_reason"
#: trials.csv's column marking the search trial that ran the base config's own values.
BASE_CONFIG: Final = "base_config"
#: Label of a pruned trial the rules diagnosed, as the report and ``sweeps audit`` count it.
PRUNED_LABEL_PREFIX: Final = "pruned · "


def objective_column(metric: str) -> str:
    """trials.csv's column of an objective's value (as told to the sampler).

    Example:
        >>> objective_column("val_loss"), seed_column("val_loss", 42)
        ('objective_val_loss', 'val_loss@seed42')
    """
    return OBJECTIVE_PREFIX + metric


def seed_column(metric: str, seed: int) -> str:
    """A judged candidate's quality on one seed."""
    return f"{seed_column_prefix(metric)}{seed}"


def seed_column_prefix(metric: str) -> str:
    """What the columns of a judged candidate's quality on each seed start with."""
    return f"{metric}@seed"


def pruned_label(rule: str) -> str:
    """``pruned · <rule>``: a pruned trial the rules diagnosed, as a failure label.

    Example:
        >>> pruned_label("collapse")
        'pruned · collapse'
    """
    return PRUNED_LABEL_PREFIX + rule

#: In the header of a rank-1 config that is worse than the base config on fresh seeds
#: (``sweeps best`` then withholds it unless ``--allow-worse``).
WORSE_THAN_BASE: Final = "WORSE than your base config"

#: In the header of a handed-over config when the base config went unstable on every seed
#: it ran (its search trial was stopped), so it has no fresh-seed mean to compare with
#: (``sweeps best`` repeats the line on stderr).
BASE_NOT_COMPARED: Final = "not compared with your base config"
#: In a handed-over config's header when it leads the base config by less than their fresh
#: seeds vary (``sweeps best`` repeats the line on stderr: the change may buy nothing).
NOT_TOLD_APART: Final = "not told apart"

#: Set on a Ray job by ``sweeps submit``: the sweep file as the user submitted it (the job
#: loads a temporary copy of it, which is not where the user finds it).
SUBMITTED_FROM_ENV: Final = "SWEEPS_SUBMITTED_FROM"
#: Set in a Ray job's driver by Ray's job supervisor (which also sets ``RAY_ADDRESS`` to
#: the cluster's GCS address).
RAY_JOB_ENV: Final = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: Set by the SLURM batch script (``sweeps slurm``) on its driver: the Ray cluster it runs
#: on ends with the job, so the sweep continues in a new job, not on that address.
SLURM_DRIVER_ENV: Final = "SWEEPS_SLURM_DRIVER"
