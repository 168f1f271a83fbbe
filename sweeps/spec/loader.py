"""The sweep file: loaded, validated and resolved before anything runs.

Every problem becomes a :class:`~sweeps.errors.SpecError` naming the key path
and the fix, so the CLI can exit 2 with nothing written and no Ray started.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from sweeps.errors import SpecError, a_type
from sweeps.protocol import RAY_JOB_ENV, SUBMITTED_FROM_ENV
from sweeps.rules.settings import RuleSettings
from sweeps.spec import hydra_config, probed, strict_yaml
from sweeps.spec.argparse_options import check_values, parser_of
from sweeps.spec.config_paths import collision, get_path, leaf_paths, split_path, with_values
from sweeps.spec.hydra_groups import (
    GroupKnobs,
    compose_variants,
    group_knobs,
    group_of_choices,
    inner_name_notes,
    primary_groups,
)
from sweeps.spec.space import (
    KNOB_TYPES,
    Categorical,
    Fixed,
    IntBound,
    IntRange,
    Knob,
    LogUniform,
    Uniform,
    _Knob,
    contains,
    fixed_values,
    knob_entry,
    off_space,
    warmup_steps,
)
from sweeps.spec.trainer_loader import load_trainer, search_paths
from sweeps.terminal import shell_word
from sweeps.trial.compile import COMPILE_MODES

RESERVED_KEY = "sweep"
#: Hydra's (OmegaConf's) mandatory value that is not set yet.
HYDRA_MISSING = "???"
#: A ``write_back`` entry that is no knob: where the user's config keeps its step count;
#: every trial's config and every handed-over config get ``budget.max_steps`` there.
STEPS_KNOB = "max_steps"
#: Leaf names that usually hold a config's step count (for the note when none is mapped).
#: Sections whose step counts are not the run's length (``eval.steps``, ``warmup.steps``).
NOT_THE_RUN = ("eval", "val", "test", "log", "save", "checkpoint", "warmup", "print")
STEP_COUNT_NAMES = ("max_steps", "steps", "num_steps", "total_steps", "train_steps",
                    "n_steps", "max_iters", "num_iterations", "iterations")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_KNOB = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Objective(_Strict):
    """One objective: a reported metric (its last value) or a derived one."""

    metric: str = Field(min_length=1)
    mode: Literal["min", "max"] = "min"
    noise: float | None = Field(
        default=None, ge=0, description="differences up to this do not shape the Pareto "
        "front (step_time: a relative share; other metrics: absolute); default: measured "
        "for step_time, 0.1 for instability, 0 else")
    baseline: float | None = Field(
        default=None, description="this metric's random-guess value (a min objective): "
        "quality gaps (confirm.tolerance, poor, the audit, sweeps stability) are a share of "
        "the improvement over it; default rules.baseline_loss, which is right when the "
        "metric is the training loss measured on held-out data, and wrong when it is "
        "another measure (e.g. a mean angle beside an NLL training loss)")


class Budget(_Strict):
    """How much the sweep may spend."""

    trials: IntBound = Field(default=32, ge=1, description="trials the search runs (with "
                        "total_steps: an upper bound, none unless given)")
    max_steps: IntBound = Field(default=400, ge=1, le=10**9,
                                description="optimizer steps per trial")
    total_steps: IntBound | None = Field(
        default=None, ge=1, description="training steps the search may spend in all; no "
        "new trial starts once they are spent, so steps saved by stopping unstable or "
        "poor trials early buy more trials")
    concurrent: IntBound = Field(default=2, ge=1, description="trials running at once")
    scheduler: Literal["asha", "none"] = Field(
        default="asha", description="early stopping of poor but stable trials")
    grace_steps: int | None = Field(
        default=None, ge=1, description="steps before ASHA may stop a trial (max_steps/4)")
    search_on: Literal["all", "quality"] = Field(
        default="all", description="what TPE optimises: every objective (all), or the first "
        "objective alone with instability as a constraint (quality); selection always uses "
        "every objective")
    sampler: Literal["tpe-multivariate", "tpe"] = Field(
        default="tpe-multivariate", description="TPE modelling the knobs jointly, with a "
        "random start of a quarter of the trials (4-10) and running trials counted as bad "
        "(tpe-multivariate); or Optuna's default TPESampler, what Ray Tune's OptunaSearch "
        "uses: 10 random trials, the knobs jointly for one searched objective and each on "
        "its own for several (tpe)")
    hang_timeout: float | None = Field(
        default=900.0, gt=0, description="seconds a trial may go without reporting before it "
        "is stopped as hung (the first report includes data loading and compilation); "
        "null = never")
    max_failures: int = Field(
        default=2, ge=0, description="retries of a trial whose worker died, from its last "
        "checkpoint")

    @field_validator("total_steps")
    @classmethod
    def _one_trial_fits(cls, total: int | None, info: ValidationInfo) -> int | None:
        most = info.data.get("max_steps")
        if total is not None and most is not None and total < most:
            raise PydanticCustomError(
                "budget_fit", "{total} is less than one trial's max_steps ({most})",
                {"total": total, "most": most,
                 "fix": f"total_steps: {most * 8} (8 trials), or max_steps: {total}"})
        return total

    @field_validator("grace_steps")
    @classmethod
    def _grace_below_max(cls, grace: int | None, info: ValidationInfo) -> int | None:
        most = info.data.get("max_steps")
        if grace is not None and most is not None and grace >= most:
            raise PydanticCustomError(
                "grace_fit", "{grace} leaves ASHA no rung before a trial's max_steps ({most})",
                {"grace": grace, "most": most,
                 "fix": f"grace_steps: {max(1, most // 2)} (or any below {most}), or "
                        "scheduler: none to stop no trial for poor quality"})
        return grace

    @property
    def trial_cap(self) -> int | None:
        """Most search trials to start: ``trials``, or None (no cap) for a step budget
        without an explicit ``trials``."""
        if self.total_steps is not None and "trials" not in self.model_fields_set:
            return None
        return self.trials

    @property
    def asha_grace(self) -> int:
        """Steps before ASHA may stop a trial: ``grace_steps`` or max_steps / 4, at most
        max_steps."""
        return min(self.grace_steps or max(1, self.max_steps // 4), self.max_steps)

    @property
    def expected_trials(self) -> int:
        """Trials the search will likely run (a step budget: one per ``max_steps``)."""
        cap = self.trial_cap
        return cap if cap is not None else max(1, (self.total_steps or 0) // self.max_steps)

    @property
    def startup_trials(self) -> int:
        """The sampler's random start: TPE models the space only after this many trials."""
        return min(10, max(4, self.expected_trials // 4))


class Confirm(_Strict):
    """Re-runs of the best candidates before a config is written to stable/."""

    seeds: int = Field(default=2, ge=0, le=100, description="extra seeds per candidate")
    lr_probe: float = Field(default=2.0, ge=0, description="LR multiplier probe; 0 = off")
    tolerance: float = Field(
        default=0.2, gt=0, description="largest gap between a candidate's worst and best "
        "seed on the quality objective, as a share of the best seed's improvement over "
        "its baseline (objectives[0].baseline, default rules.baseline_loss; of |best| "
        "without one); a wider gap makes the candidate fragile")
    keep: int = Field(default=3, ge=1, description="confirmed configs to find: candidates "
                      "are confirmed down the ranked list until this many hold")
    max_candidates: int = Field(default=8, ge=1, description="most candidates to re-run")
    base: bool = Field(default=True, description="the base config's own knob values are "
                       "the search's first trial and race like any config (off the space: "
                       "re-run on the same seeds after the search), so the handed-over "
                       "configs are compared with what the user had")
    narrow_seeds: int = Field(
        default=4, ge=0, le=100, description="fresh seeds a config whose LR probe found a "
        "narrow margin (it failed, or held but gave up more than confirm.tolerance of the "
        "config's gain) must hold on, instead of confirm.seeds")
    require_margin: bool = Field(
        default=False, description="a config whose LR probe found a narrow margin is "
        "fragile (true), instead of racing on confirm.narrow_seeds fresh seeds (false)")


class Resources(_Strict):
    """Resources per trial (Ray's: a fraction of a GPU lets trials share it)."""

    cpu: float = Field(default=1.0, ge=0.0001, description="CPUs per trial; Ray counts "
                       "them in steps of 0.0001")
    gpu: float = Field(default=0.0, ge=0, description="GPUs per trial: a fraction up to 1 "
                       "packs trials onto one GPU (0.25: four per GPU), more than 1 must be "
                       "a whole number")

    @field_validator("cpu")
    @classmethod
    def _ray_cpu_amount(cls, cpu: float) -> float:
        if round(cpu, 4) != cpu:
            raise PydanticCustomError(
                "cpu_precision", "{cpu} CPUs: Ray counts CPUs in steps of 0.0001",
                {"cpu": cpu, "fix": f"cpu: {max(round(cpu, 4), 0.0001):g}"})
        return cpu

    @field_validator("gpu")
    @classmethod
    def _ray_gpu_amount(cls, gpu: float) -> float:
        if gpu > 1 and not float(gpu).is_integer():
            raise ValueError(f"{gpu:g} GPUs: Ray takes a fraction of one GPU or a whole "
                             f"number of GPUs; use {int(gpu)} or {int(gpu) + 1}, or a "
                             "fraction up to 1")
        return gpu


class Preflight(_Strict):
    """Checks before any trial runs (see docs/preflight.md)."""

    scheduler: str | None = Field(
        default=None, description="module:function(config, optimizer) -> LR scheduler; "
        "default: the trainer module's lr_scheduler")
    batch: str | None = Field(
        default=None, description="module:function(config) -> one input batch; "
        "default: the trainer module's sample_batch")
    input_limit: float = Field(default=100.0, gt=0,
                               description="largest acceptable |mean| or std of a feature")
    compile_timeout: float = Field(default=300.0, gt=0,
                                   description="seconds a compile-mode probe may take")


class SweepFile(_Strict):
    """The sweep file as written by the user."""

    name: str = Field(min_length=1, max_length=100)
    trainer: str = Field(min_length=1)
    base_config: str | dict[str, Any] | None = None
    search_space: str | dict[str, Any] = "search_spaces/default.yaml"
    write_back: dict[str, str | list[str]]
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective(metric="val_loss"), Objective(metric="instability")],
        min_length=1)
    rules: RuleSettings = Field(default_factory=RuleSettings)
    budget: Budget = Field(default_factory=Budget)
    confirm: Confirm = Field(default_factory=Confirm)
    resources: Resources = Field(default_factory=Resources)
    preflight: Preflight = Field(default_factory=Preflight)
    initial_points: list[dict[str, Any]] = Field(
        default_factory=list, description="knob values the search tries first")
    output: str = "results"
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="the search's seed; "
                      "the fresh seeds follow it (seed + 1, ...); what Optuna's sampler and "
                      "NumPy take")
    new_keys: bool = Field(
        default=False, description="write_back paths the base config lacks are added to it "
        "(true) instead of refused (a typo'd path writes a key the trainer never reads)")
    config_format: Literal["yaml", "json"] | None = Field(
        default=None, description="the format of the configs handed over in stable/; "
        "default: json for a .json base_config file, else yaml")
    hydra_groups: dict[str, Any] | None = Field(
        default=None, description="written by sweeps into a results folder's sweep.yaml: "
        "the config each combination of Hydra config-group knobs composed")

    @field_validator("write_back")
    @classmethod
    def _one_path_a_knob(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        """A knob has one path; ``max_steps`` may list several (a trainer's step count and
        a scheduler's total steps), each set to ``budget.max_steps``."""
        for knob, path in value.items():
            if isinstance(path, str):
                continue
            if knob != STEPS_KNOB:
                raise PydanticCustomError(
                    "one_path", "a knob is written to one path, not a list",
                    {"at": knob, "fix": f"give write_back.{knob} one dotted path (only "
                     "max_steps takes a list: every path that holds the run's step count)"})
            if not path or len(set(path)) < len(path):
                raise PydanticCustomError(
                    "steps_paths", "lists no path, or one path twice",
                    {"at": knob, "fix": "list each path that holds the run's step count once, "
                     "e.g. max_steps: [trainer.max_steps, scheduler.total_steps]"})
        return value


@dataclass
class Sweep:
    """A validated sweep, with its files read and paths resolved."""

    spec: SweepFile
    base_dir: Path
    base_config: dict[str, Any]
    space: dict[str, _Knob]
    trainer_paths: list[str]
    output_dir: Path
    objectives: list[Objective]
    #: The folder sweeps was started from: every trial runs there, so a trainer's relative
    #: paths mean what they mean in ``sweeps try``.
    workdir: Path
    source: Path | None = None
    notes: list[str] = field(default_factory=list)
    #: ``search_space.lr.high`` is ``probe`` and not probed yet: the knob's high stands at
    #: the probe's ceiling until ``sweeps run`` sets it (:mod:`sweeps.spec.probed`).
    lr_high_to_probe: bool = False
    #: Knobs that pick a Hydra config group's option (:mod:`sweeps.spec.hydra_groups`).
    groups: GroupKnobs | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def config_format(self) -> str:
        """``yaml`` or ``json``: the format of the handed-over configs
        (``config_format``, else that of a ``base_config`` file)."""
        if self.spec.config_format is not None:
            return self.spec.config_format
        return "json" if is_json_file(self.spec.base_config) else "yaml"

    def values_by_path(self, values: Mapping[str, Any],
                       max_steps: int | None = None) -> dict[str, Any]:
        """Knob values keyed by their write-back paths, and the step count (``max_steps``,
        else ``budget.max_steps``) at ``write_back.max_steps`` when the sweep maps it."""
        out = {self.spec.write_back[k]: v for k, v in values.items()
               if k not in self.grouped}
        for path in self.steps_paths:
            out[path] = max_steps or self.spec.budget.max_steps
        return out

    @property
    def write_back_paths(self) -> dict[str, str]:
        """``write_back`` with one path an entry (:func:`flat_write_back`)."""
        return flat_write_back(self.spec.write_back)

    @property
    def grouped(self) -> dict[str, str]:
        """``knob -> Hydra config group`` of the knobs that pick a group's option."""
        return self.groups.knobs if self.groups else {}

    def base_for(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The config a trial's knob values are written into: the base config, or with
        group knobs the one composed with the trial's options."""
        return self.groups.config(values) if self.groups else self.base_config

    def base_value(self, knob: str) -> Any:
        """The base config's value of a knob: None where it has none (the key is absent,
        or holds Hydra's missing value ``???``); a group knob's is the primary config's
        option."""
        if self.groups and knob in self.grouped:
            return self.groups.defaults.get(self.grouped[knob])
        value = get_path(self.base_config, self.spec.write_back[knob], None)
        return None if value == HYDRA_MISSING else value

    @property
    def fixed_changes(self) -> dict[str, Any]:
        """Knobs the search space fixes at another value than the base config's: every
        trial, the base config's own runs included, runs with these values."""
        return {k: v for k, v in fixed_values(self.space).items()
                if k in self.spec.write_back and (base := self.base_value(k)) is not None
                and base != v}

    @property
    def base_unset(self) -> list[str]:
        """Knobs the base config leaves at Hydra's missing value ``???``: it is no config
        that runs, so there is no base config to compare with."""
        return [k for k in self.space if k in self.spec.write_back and k not in self.grouped and
                get_path(self.base_config, self.spec.write_back[k], None) == HYDRA_MISSING]

    @property
    def steps_paths(self) -> list[str]:
        """Where the user's config keeps its step count (``write_back.max_steps``, a path
        or a list of them, when it is no knob of the search space); empty when nowhere."""
        if STEPS_KNOB in self.space:
            return []
        found = self.spec.write_back.get(STEPS_KNOB)
        return [] if found is None else [found] if isinstance(found, str) else list(found)

    @property
    def quality_baseline(self) -> float | None:
        """The quality objective's random-guess value: its own ``baseline``, else
        ``rules.baseline_loss`` for a ``min`` objective (a loss; an accuracy to maximise
        has no loss's baseline)."""
        return self.baseline_of(self.objectives[0]) if self.objectives else \
            self.spec.rules.baseline_loss

    def baseline_of(self, objective: Objective) -> float | None:
        """An objective's random-guess value (see :attr:`quality_baseline`)."""
        if objective.baseline is not None:
            return objective.baseline
        return None if objective.mode == "max" else self.spec.rules.baseline_loss

    def resolved(self) -> dict[str, Any]:
        """The sweep as one self-contained document (base config and space inline), as
        written to ``<results>/sweep.yaml`` and shipped to clusters; a step budget without
        a trial cap stays so (the model's default ``trials`` is not written)."""
        data = self.spec.model_dump(mode="json")
        if self.spec.budget.trial_cap is None:
            del data["budget"]["trials"]
        data["base_config"] = self.base_config
        data["config_format"] = self.config_format  # inline now: the file's format kept
        data["hydra_groups"] = self.groups.to_data() if self.groups else None
        data["search_space"] = {k: knob_entry(v) for k, v in self.space.items()}
        if self.lr_high_to_probe:  # a run of this copy probes (e.g. a cluster's job)
            data["search_space"]["lr"]["high"] = probed.PROBE
        return data

    def with_probed_lr(self, record: probed.ProbedHigh) -> tuple[Sweep, list[str]]:
        """This sweep with lr's range ending at the probed ``record.boundary_low``, and a
        note per initial point it leaves out (its lr above the probed high)."""
        knob = self.space["lr"].model_copy(update={"high": record.boundary_low,
                                                   "probed": record})
        space = {**self.space, "lr": knob}
        keep, notes = [], []
        for i, point in enumerate(self.spec.initial_points):
            if "lr" in point and not contains(knob, point["lr"]):
                notes.append(f"initial_points.{i}: lr {point['lr']!r} is above the probed "
                             f"high {record.boundary_low:.4g}: left out")
            else:
                keep.append(point)
        spec = self.spec.model_copy(update={"initial_points": keep})
        return replace(self, spec=spec, space=space, lr_high_to_probe=False), notes

    @property
    def confirm_steps(self) -> int:
        """Training steps a step budget keeps back for confirmation: ``confirm.keep``
        candidates on every fresh seed and the LR probe, and the base config's runs."""
        conf = self.spec.confirm
        base = conf.seeds if conf.base else 0
        return self.confirm_round_steps + base * self.spec.budget.max_steps

    @property
    def confirm_round_steps(self) -> int:
        """Training steps of one confirmation round: ``confirm.keep`` candidates, each on
        every fresh seed and at LR × probe (what a round costs when all of them hold)."""
        conf = self.spec.confirm
        per = conf.seeds + (1 if conf.lr_probe > 0 and "lr" in self.space else 0)
        return conf.keep * per * self.spec.budget.max_steps

    @property
    def search_steps(self) -> int | None:
        """Training steps the search may spend, its races on fresh seeds included:
        ``budget.total_steps`` (nothing is kept back; see :mod:`sweeps.results.race`)."""
        return self.spec.budget.total_steps

    def trial_config(self, values: Mapping[str, Any], *, trial_id: str, seed: int,
                     max_steps: int | None = None) -> dict[str, Any]:
        """The config a trainer receives: base config, knob values merged, ``sweep`` key."""
        config = with_values(self.base_for(values), self.values_by_path(values, max_steps))
        config[RESERVED_KEY] = {"trial_id": trial_id, "seed": seed,
                                "max_steps": max_steps or self.spec.budget.max_steps,
                                "device": "cpu", "gpu_ids": []}
        return config


def read_yaml(path: Path, key: str) -> Any:
    """A YAML file's data (safe types only); a missing or malformed file, bytes that are
    not UTF-8 or a key given twice is a SpecError naming the line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(key, f"cannot read {path} ({exc.strerror or exc})",
                        "check the path; relative paths start at the sweep file's folder") from exc
    try:
        return strict_yaml.load(strict_yaml.decode(data))
    except strict_yaml.YamlProblem as exc:
        raise SpecError(key, f"{path} line {exc.line}: {exc.problem}", exc.fix) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        fix = "fix the YAML syntax (indentation, colons, quotes)"
        if "'\\t'" in problem:  # PyYAML's "found character '\t' that cannot start …"
            problem = "a tab, which YAML does not take there (it indents with spaces only)"
            fix = (f"replace the tab{where} with spaces (e.g. `expand -t 2 {path.name}`, or "
                   "your editor's \"convert indentation to spaces\")")
        raise SpecError(key, f"{path} is not valid YAML{where}: {problem}", fix) from exc


def is_json_file(value: Any) -> bool:
    """Whether a ``base_config`` value names a JSON file (by its ``.json`` suffix)."""
    return isinstance(value, str) and value.lower().endswith(".json")


def read_json(path: Path, key: str) -> Any:
    """A JSON file's data, read as JSON (a trailing comma or a key given twice is an
    error, as it is for the user's own ``json.load``); a SpecError names the line."""
    try:
        text = strict_yaml.decode(path.read_bytes())
    except OSError as exc:
        raise SpecError(key, f"cannot read {path} ({exc.strerror or exc})",
                        "check the path; relative paths start at the sweep file's folder") from exc
    except strict_yaml.YamlProblem as exc:
        raise SpecError(key, f"{path} line {exc.line}: {exc.problem}", exc.fix) from None

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"key {k!r} is given twice")
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise SpecError(key, f"{path} is not valid JSON at line {exc.lineno}, column "
                        f"{exc.colno}: {exc.msg}", "fix the JSON syntax (a trailing comma, "
                        "a missing quote, comma or brace)") from None
    except ValueError as exc:
        raise SpecError(key, f"{path}: {exc}",
                        "keep one of them; with two, one would be ignored") from None


def no_sweep_file(path: Path, given: Path | str) -> SpecError:
    """The error for a sweep file ``given`` (at ``path``) that is no file: a folder is
    named as one, with the YAML files in it when there are few."""
    if not path.is_dir():
        return SpecError("FILE", f"no sweep file at {given}",
                         "give the path of a sweep YAML file")
    found = sorted(p.name for p in path.iterdir()
                   if p.suffix in (".yaml", ".yml") and p.is_file())
    if not found:
        fix = f"give the path of a sweep YAML file ({given} holds no .yaml file)"
    elif len(found) <= 5:
        shown = " or ".join(shell_word(Path(given) / name) for name in found)
        fix = f"give the sweep YAML file in it: {shown}"
    else:
        fix = f"give the sweep YAML file in it ({len(found)} .yaml files there, e.g. " \
            f"{shell_word(Path(given) / found[0])})"
    return SpecError("FILE", f"{given} is a folder, not a sweep file", fix)


def load_sweep(path: str | Path, *, workdir: Path, import_trainer: bool = True,
               output: str | None = None) -> Sweep:
    """Read and validate a sweep file; ``output`` overrides its ``output:`` folder.

    ``workdir`` is the folder sweeps was started from: a relative ``path`` and ``output:``
    start there, and it is the fallback for the sweep file's relative paths."""
    given = Path(path).expanduser()
    path = workdir / given
    if not path.is_file():
        raise no_sweep_file(path, given)
    data = read_yaml(path, "FILE")
    if output is not None and isinstance(data, dict):
        data = {**data, "output": output}
    sweep = load_sweep_dict(data, base_dir=path.parent, workdir=workdir,
                            import_trainer=import_trainer)
    sweep.source = path.resolve()
    origin = os.environ.get(SUBMITTED_FROM_ENV)
    if origin and os.environ.get(RAY_JOB_ENV) and \
            Path(origin).name == path.name:
        sweep.source = Path(origin)  # not the job's temporary copy of it
    return sweep


def load_sweep_dict(data: Any, *, base_dir: Path, workdir: Path,
                    import_trainer: bool = True) -> Sweep:
    """Validate an already-parsed sweep mapping; relative paths in it are read from
    ``base_dir``, then ``workdir`` (see :func:`load_sweep`). Raises only :class:`SpecError`."""
    if not isinstance(data, Mapping):
        raise SpecError("(top level)", f"the sweep file holds {a_type(data)}, "
                        "not a mapping", "write keys such as name:, trainer:, write_back:")
    spec = _validate(SweepFile, data, "")
    if not _NAME.fullmatch(spec.name):
        raise SpecError("name", f"{spec.name!r} is not usable as a folder name",
                        "use letters, digits, '-', '_' or '.'")
    base_dir, workdir = base_dir.resolve(), workdir.resolve()
    dirs = (base_dir, workdir)
    base_config = _base_config(spec.base_config, dirs)
    space, to_probe = _space(spec.search_space, dirs)
    compile_knob = space.get("compile")
    if isinstance(compile_knob, Fixed) and compile_knob.value in ("none", None, False) and \
            "compile" not in flat_write_back(spec.write_back):
        del space["compile"]  # fixed at no compiling, written nowhere: the trainer compiles nothing
    primary = _hydra_primary(spec, dirs)
    groups = _groups(spec, space, primary)
    grouped = groups.knobs if groups else {}
    write_back = {k: v for k, v in flat_write_back(spec.write_back).items()
                  if k not in grouped}
    _check_write_back(write_back, {k: v for k, v in space.items() if k not in grouped},
                      base_config)
    _check_initial_points(spec.initial_points, space)
    objectives = list(spec.objectives)
    notes: list[str] = inner_name_notes(write_back, space, primary_groups(primary[1]),
                                        primary[0].parent) if primary else []
    if groups:
        _check_every_option_has(write_back, groups.configs)
    for variant, config in (groups.configs.items() if groups else [("", base_config)]):
        found = new_path_notes(write_back, config)
        if found and not spec.new_keys:
            raise _missing_path_error(write_back, config, variant, space, primary)
        found += _value_kind_notes(write_back, space, config, variant)
        notes += [n for n in found if n not in notes]
    compile_knob = space.get("compile")
    if compile_knob is not None and not compile_knob.is_fixed() and not any(
            o.metric == "step_time" for o in objectives):
        objectives.append(Objective(metric="step_time", mode="min"))
        notes.append("compile mode is searched: step_time (steady state) added as an objective")
    seen: set[str] = set()
    for i, obj in enumerate(objectives):
        if obj.metric == "eval_loss":
            notes.append(f"objectives.{i}: the Hugging Face adapter (train_hf) reports the "
                         "Trainer's eval_loss as val_loss: with it, name val_loss")
        if obj.metric in seen:
            raise SpecError(f"objectives.{i}.metric", f"{obj.metric!r} is listed twice",
                            "list each objective metric once")
        seen.add(obj.metric)
    if to_probe:
        notes.append(probed.note(getattr(space["lr"], "low", 0.0)))
    notes += step_count_notes(spec, space, base_config)
    flat = flat_window_note(spec, space)
    if flat:
        notes.append(flat)
    if objectives and objectives[0].mode == "max" and objectives[0].baseline is None:
        notes.append(f"objectives.0: {objectives[0].metric} (max) has no baseline, so quality "
                     "gaps are shares of the best value; set 'baseline:' to what a random guess "
                     "scores (e.g. 1/classes for an accuracy)")
    paths = search_paths(base_dir, workdir)
    sweep = Sweep(spec=spec, base_dir=base_dir, base_config=base_config, space=space,
                  trainer_paths=paths, output_dir=(workdir / spec.output / spec.name).resolve(),
                  objectives=objectives, workdir=workdir, notes=notes,
                  lr_high_to_probe=to_probe, groups=groups)
    changed = sweep.fixed_changes
    if changed:
        shown = ", ".join(f"{k}={v}" for k, v in changed.items())
        notes.append(f"the search space fixes {shown}, unlike your base config: every trial "
                     f"runs with it, so 'your base config' below is yours with {shown}")
    if sweep.base_unset:
        notes.append(f"the base config leaves {', '.join(sweep.base_unset)} at ??? (no value): "
                     "there is no base config to run or compare with, and `sweeps try` takes "
                     "the middle of the range")
    _check_base_numbers(sweep)
    _check_hf_scheduler_section(sweep)
    off = off_space_note(sweep)
    if off:
        notes.append(off)
    if import_trainer:
        parser = parser_of(load_trainer(spec.trainer, paths))
        if parser is not None:
            check_values(parser, space, write_back)
    return sweep


#: The Hugging Face preflight hooks and the section of the base config each reads.
HF_SCHEDULER_HOOK = "sweeps.integrations.huggingface:lr_scheduler"


def _check_hf_scheduler_section(sweep: Sweep) -> None:
    """A SpecError when ``preflight.scheduler`` is the Hugging Face hook and the base config
    has no ``training_args`` section for it to read: it would fail the preflight, after
    ``validate`` had said the file was valid."""
    if sweep.spec.preflight.scheduler != HF_SCHEDULER_HOOK or \
            isinstance(sweep.base_config.get("training_args"), Mapping):
        return
    sections = [k for k, v in sweep.base_config.items() if isinstance(v, Mapping)
                and {"learning_rate", "max_steps", "lr_scheduler_type"} & set(v)]
    name = sections[0] if sections else "training"
    raise SpecError("preflight.scheduler", f"{HF_SCHEDULER_HOOK} reads the base config's "
                    "'training_args' section, which it lacks", "point it at a hook of your "
                    "trainer module that names your section: def lr_scheduler(config, "
                    "optimizer): return hf_lr_scheduler(config, optimizer, section="
                    f"{name!r}) (from sweeps.integrations.huggingface import lr_scheduler as "
                    "hf_lr_scheduler), with preflight: {scheduler: <module>:lr_scheduler}; "
                    "for one flat args file, sweeps.integrations.huggingface:lr_scheduler_flat")


def _check_base_numbers(sweep: Sweep) -> None:
    """A SpecError for a base config value quoted as text (``"lr": "0.05"``) where the knob's
    values are numbers: the base config's own run (the search's first trial, ``sweeps
    try``, the reference on the fresh seeds) would hand the trainer text and crash."""
    for name, knob in sweep.space.items():
        value = sweep.base_value(name) if name in sweep.spec.write_back else None
        values = _knob_values(knob)
        if not _float_text(value) or not values or any(
                not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
            continue
        path = sweep.spec.write_back[name]
        raise SpecError(f"base_config.{path}", f"{value!r} is text, not a number, and "
                        f"search_space.{name} gives numbers: the base config's own run "
                        "would hand the trainer text",
                        "write it unquoted in the base config, with a dot and a signed "
                        f"exponent if it has one (YAML reads 5e-4 as text): "
                        f"{yaml_number(float(value))}")


def yaml_number(value: float) -> str:
    """``value`` spelt so that YAML 1.1 (PyYAML's ``safe_load``) reads it as a number: an
    exponent needs a dot in the mantissa and a signed exponent.

    Example:
        >>> yaml_number(5e-4), yaml_number(1e-05), yaml_number(0.05), yaml_number(3e20)
        ('0.0005', '1.0e-05', '0.05', '3.0e+20')
    """
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    if not e:
        return text
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent if exponent[0] in '+-' else '+' + exponent}"


def flat_window_note(spec: SweepFile, space: dict[str, _Knob]) -> str | None:
    """A note when ``flat_at_baseline`` can never fire: its patience, counted after the
    warmup (the ``warmup`` knob's smallest value), is not shorter than a trial's steps, so
    a run at the random guess ends ok and nothing flags it."""
    rules, steps = spec.rules, spec.budget.max_steps
    if not rules.is_enabled("flat_at_baseline"):
        return None
    knob = space.get("warmup")
    lows = [v for v in _knob_values(knob) if isinstance(v, (int, float))] if knob else []
    warm = warmup_steps(min(lows), steps) if lows else 0
    room = steps - (warm or 0)
    if rules.flat_patience < room:
        return None
    after = f" less the smallest warmup ({warm} steps)" if warm else ""
    return (f"rules.flat_patience ({rules.flat_patience}) is not below budget.max_steps "
            f"({steps}){after}: flat_at_baseline can never fire, so a run at the random "
            "guess ends ok and nothing flags it; set rules.flat_patience to about half of "
            f"that, e.g. {max(1, room // 2)}")


def off_space_note(sweep: Sweep) -> str | None:
    """What happens to a base config whose own values lie off the search space (with
    ``confirm.base``): it races on the fresh seeds only, and the search starts at the
    nearest point in the space when only numbers out of range put it off."""
    if not sweep.spec.confirm.base or sweep.base_unset:
        return None
    off = off_space(sweep.space, {name: sweep.base_value(name) for name in sweep.space})
    if not off:
        return None
    start = ("the search starts at the point in the space nearest it ("
             + ", ".join(f"{k}={near:.4g}" for k, (_, near) in off.items()) + ")"
             if all(near is not None for _, near in off.values()) else
             "the search starts without it (" + "; ".join(
                 f"{k}: {_why_off(sweep.space[k], value)}"
                 for k, (value, near) in off.items() if near is None) + ")")
    shown = ", ".join(f"{k}={value!r}" for k, (value, _) in off.items())
    return (f"your base config's {shown} lies off the search space: {start}, and "
            "your base config's own values run on the fresh seeds only, as the reference; "
            "let the range include the value to race it as the search's first trial")


def _why_off(knob: Any, value: Any) -> str:
    """Why a base config's ``value`` is off a knob that has no nearest point: not among
    its choices, or text where numbers belong (``'64'``, written quoted)."""
    number = None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if isinstance(knob, Categorical):
        if number is not None and any(not isinstance(c, bool) and c == number
                                      for c in knob.choices if isinstance(c, (int, float))):
            return (f"{value!r} is text where the choices are numbers: write it as "
                    f"{value.strip()} in the base config, unquoted")
        return "not among its choices"
    if number is not None:
        return f"{value!r} is text, not a number: write it unquoted in the base config"
    return f"{value!r} is no number (an interpolation counts as text here)"


#: Where relative paths in a sweep file are read: the sweep file's folder, then the folder
#: sweeps was started from.
Dirs = tuple[Path, Path]


def _resolve(rel: str, dirs: Dirs) -> Path:
    p = Path(rel).expanduser()
    if p.is_absolute():
        return p
    beside, started = dirs[0] / p, dirs[1] / p
    return beside if beside.exists() or not started.exists() else started


#: ``extends: sweeps:<name>`` (or a ``search_spaces/<name>.yaml`` found nowhere else) names
#: a search space shipped inside the package.
PACKAGED_PREFIX = "sweeps:"


def _space_file(rel: str, dirs: Dirs) -> Path:
    """A search space file: beside the sweep file or in the working directory (see
    :func:`_resolve`), else the copy shipped in the package, so ``search_spaces/default.yaml``
    works from any folder and any install; ``sweeps:default`` always means the shipped one."""
    from importlib.resources import files

    shipped = Path(str(files("sweeps") / "search_spaces"))
    if rel.startswith(PACKAGED_PREFIX):
        name = rel[len(PACKAGED_PREFIX):]
        names = sorted(p.stem for p in shipped.glob("*.yaml"))
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            raise SpecError("search_space.extends", f"{rel!r} names no space shipped with "
                            f"sweeps ({', '.join(PACKAGED_PREFIX + n for n in names)})",
                            (f"did you mean '{PACKAGED_PREFIX}{near[0]}'?" if near else
                             f"write one of them, e.g. '{PACKAGED_PREFIX}{names[0]}'")
                            + ", or a path to a space file of your own")
        return shipped / f"{name}.yaml"
    path = _resolve(rel, dirs)
    parts = Path(rel).parts
    if not path.exists() and len(parts) >= 2 and parts[-2] == "search_spaces" and \
            (shipped / parts[-1]).is_file():
        return shipped / parts[-1]
    return path


def _base_config(value: str | dict[str, Any] | None, dirs: Dirs) -> dict[str, Any]:
    """The base config: a mapping inline, a YAML or JSON (``.json``) file, or a Hydra
    primary config (a file with a ``defaults:`` list, composed by Hydra:
    :mod:`sweeps.spec.hydra_config`)."""
    if value is None:
        return {}
    data = value
    if isinstance(value, str):
        _check_config_format(value)
    if is_json_file(value):
        data = read_json(_resolve(str(value), dirs), "base_config")
    elif isinstance(value, str):
        path = _resolve(value, dirs)
        data = read_yaml(path, "base_config")
        if hydra_config.is_hydra(data):
            data = hydra_config.compose(path)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError("base_config", f"the base config holds {a_type(data)}, "
                        "not a mapping", "point it at a YAML (or JSON) file of key: value sections")
    for key in data:
        if not isinstance(key, str):
            raise SpecError(f"base_config.{key}", "keys must be strings",
                            "quote the key in the YAML")
    if RESERVED_KEY in data:
        raise SpecError(f"base_config.{RESERVED_KEY}", f"'{RESERVED_KEY}' is reserved: the "
                        "trainer receives trial_id, seed, max_steps, device and gpu_ids there",
                        f"rename the '{RESERVED_KEY}' section of the base config")
    return dict(data)


#: File suffixes of config formats a base config may not be in (it is read as YAML or
#: JSON, and the handed-over configs are written in its format).
OTHER_FORMATS = {".toml": "TOML", ".ini": "INI", ".cfg": "INI", ".py": "Python",
                 ".xml": "XML", ".json5": "JSON5", ".jsonc": "JSON with comments"}


def _check_config_format(value: str) -> None:
    """A ``base_config`` file named as another format than YAML or JSON is a SpecError
    (read as YAML, a TOML file failed as "not valid YAML")."""
    fmt = OTHER_FORMATS.get(Path(value).suffix.lower())
    if fmt is not None:
        raise SpecError("base_config", f"{value} is a {fmt} file: the base config must be "
                        "YAML or JSON (sweeps reads it as such and hands over the tuned "
                        "configs in its format)", "convert it and save it as .yaml or .json "
                        f"(e.g. {Path(value).with_suffix('.yaml').as_posix()}), then point "
                        "base_config at that file")


def _hydra_primary(spec: SweepFile, dirs: Dirs) -> tuple[Path, dict[str, Any]] | None:
    """A ``base_config`` file that is a Hydra primary config, and its data as written
    (before composing), when the sweep's group knobs are not kept already (a results
    folder's ``sweep.yaml`` holds them composed); else None."""
    if spec.hydra_groups is not None or not isinstance(spec.base_config, str) or \
            is_json_file(spec.base_config):
        return None
    path = _resolve(spec.base_config, dirs)
    raw = read_yaml(path, "base_config")
    return (path, raw) if hydra_config.is_hydra(raw) else None


def _groups(spec: SweepFile, space: dict[str, _Knob],
            primary: tuple[Path, dict[str, Any]] | None) -> GroupKnobs | None:
    """The knobs that pick a Hydra config group's option, with every combination composed
    (:mod:`sweeps.spec.hydra_groups`): kept in a results folder's ``sweep.yaml``, else
    found in the Hydra ``primary`` config; None without any."""
    if spec.hydra_groups is not None:
        return GroupKnobs.from_data(spec.hydra_groups)
    if primary is None:
        return None
    path, raw = primary
    defaults = primary_groups(raw)
    knobs = group_knobs(flat_write_back(spec.write_back), space, defaults, path.parent)
    if not knobs:
        return None
    return compose_variants(path, knobs, space, defaults, hydra_config.compose)


def _check_every_option_has(write_back: dict[str, str],
                            configs: dict[str, dict[str, Any]]) -> None:
    """A path some composed option combinations have and others lack is a SpecError: a
    knob must write a key every option it may be composed with has."""
    for knob, path in write_back.items():
        have = [v for v, c in configs.items() if get_path(c, path, None) is not None]
        lack = [v for v in configs if v not in have]
        if have and lack:
            raise SpecError(f"write_back.{knob}", f"'{path}' is in the config composed with "
                            f"{have[0]} but not with {lack[0]}: a trial of those options "
                            "would get the key from nowhere (or, added, a key its options "
                            "do not have)", "give every searched option the key (e.g. "
                            f"{path.rsplit('.', 1)[-1]}: 0.0 in its file), or leave the "
                            "options that lack it out of the search")


def _space(value: str | dict[str, Any], dirs: Dirs) -> tuple[dict[str, _Knob], bool]:
    """The knobs, and whether lr's high waits for the probe (``high: probe``)."""
    if isinstance(value, str):
        raw = read_yaml(_space_file(value, dirs), "search_space")
        key_root = "search_space"
        if not isinstance(raw, Mapping):
            raise SpecError("search_space", f"{value} holds {a_type(raw)}, "
                            "not a mapping", "write one 'knob: {type: ..., ...}' per line")
        return _knobs(dict(raw), key_root)
    raw = dict(value)
    merged: dict[str, Any] = {}
    if "extends" in raw:
        ext = raw.pop("extends")
        if not isinstance(ext, str):
            raise SpecError("search_space.extends", "must be a path to a search space file",
                            "write e.g. 'extends: sweeps:default' (the six default knobs)")
        base = read_yaml(_space_file(ext, dirs), "search_space.extends")
        if not isinstance(base, Mapping):
            raise SpecError("search_space.extends", f"{ext} holds {a_type(base)}, "
                            "not a mapping", "point it at a search space file")
        merged.update(base)
    merged.update(raw)
    return _knobs({k: v for k, v in merged.items() if v is not None}, "search_space")


_KNOB_ADAPTER: TypeAdapter[Any] = TypeAdapter(Knob)
_KNOB_CLASSES = {"loguniform": LogUniform, "uniform": Uniform, "int": IntRange,
                 "categorical": Categorical, "fixed": Fixed}


#: Names a knob may not take: the columns trials.csv and pareto.csv keep for every trial
#: (a knob named ``status`` overwrote the trials' own statuses there, for good).
RESERVED_KNOBS = frozenset({
    "trial_id", "role", "status", "reason", "stop_step", "seed", "steps", "retries",
    "instability", "diagnosis", "evidence", "warnings", "base_config", "selection",
    "selection_reason", "rank", "on_front", "yaml", "confirmed", "seeds_passed",
    "seeds_run", "seeds_planned", "seed_failures", "lr_probe", "lr_probe_reason",
    "lr_sensitivity", "lr_margin", "objectives_seed"})


def _knobs(raw: dict[Any, Any], root: str) -> tuple[dict[str, _Knob], bool]:
    if not raw:
        raise SpecError(root, "the search space is empty", "add at least one knob, e.g. "
                        "'lr: {type: loguniform, low: 1.0e-5, high: 1.0e-1}'")
    space: dict[str, _Knob] = {}
    to_probe = False
    for name, entry in raw.items():
        key = f"{root}.{name}"
        if not isinstance(name, str) or not _KNOB.fullmatch(name):
            raise SpecError(key, "a knob name is an identifier of ASCII letters, digits "
                            "and '_', not starting with a digit (it is also a column of "
                            "trials.csv and an MLflow param name, and MLflow refuses some "
                            "characters a Python identifier may hold)",
                            "rename it, e.g. batch_size; write_back maps it to any key of "
                            "your config")
        if name == STEPS_KNOB:
            raise SpecError(key, "the step count is the budget, not a knob: every trial runs "
                            "budget.max_steps (write_back.max_steps says where your config "
                            "keeps it)", "drop it from search_space and set budget.max_steps")
        if name in RESERVED_KNOBS:
            raise SpecError(key, f"'{name}' names a column sweeps keeps for every trial in "
                            "trials.csv and pareto.csv", f"name the knob e.g. '{name}_' or "
                            f"'my_{name}' (write_back maps it to your config's '{name}')")
        if isinstance(entry, list):
            raise SpecError(key, "a bare list is ambiguous",
                            f"write '{{type: categorical, choices: {entry}}}'")
        if not isinstance(entry, Mapping):
            entry = {"type": "fixed", "value": entry}
        elif "type" not in entry:
            raise SpecError(f"{key}.type", "missing",
                            f"add 'type:' (one of {', '.join(KNOB_TYPES)})")
        else:
            entry, asks = probed.take(name, entry, key)
            to_probe = to_probe or asks
        knob = _validate(_KNOB_ADAPTER, entry, key)
        if name == "compile":
            _check_compile(knob, key)
        _check_known_range(name, knob, key)
        space[name] = knob
    return space, to_probe


def flat_write_back(write_back: Mapping[str, str | list[str]]) -> dict[str, str]:
    """``write_back`` with one path an entry: a ``max_steps`` list's paths as
    ``max_steps``, ``max_steps.1``, … (the keys its error messages name).

    Example:
        >>> flat_write_back({"lr": "opt.lr", "max_steps": ["trainer.max_steps", "s.total"]})
        {'lr': 'opt.lr', 'max_steps': 'trainer.max_steps', 'max_steps.1': 's.total'}
    """
    out: dict[str, str] = {}
    for knob, path in write_back.items():
        for i, one in enumerate([path] if isinstance(path, str) else path):
            out[f"{knob}.{i}" if i else knob] = one
    return out


def unmapped_step_count(spec: SweepFile, space: Mapping[str, Any],
                        base_config: dict[str, Any]) -> tuple[str, Any] | None:
    """(path, value) of a step count in the base config that differs from
    ``budget.max_steps`` and that ``write_back.max_steps`` does not list, else None: a
    handed-over config would keep it and train (or schedule) a different length than was
    confirmed."""
    if STEPS_KNOB in space:
        return None
    mapped = set(flat_write_back({k: v for k, v in spec.write_back.items()
                                  if k == STEPS_KNOB}).values())
    for path in leaf_paths(base_config):
        if path in mapped:
            continue
        value = get_path(base_config, path, None)
        *sections, leaf = path.split(".")
        if leaf in STEP_COUNT_NAMES and isinstance(value, int) and \
                not isinstance(value, bool) and value != spec.budget.max_steps and \
                not any(word in part for part in sections for word in NOT_THE_RUN):
            return path, value
    return None


def step_count_notes(spec: SweepFile, space: Mapping[str, Any],
                     base_config: dict[str, Any]) -> list[str]:
    """A note when the base config's own step count differs from the trials' (see
    :func:`unmapped_step_count`)."""
    found = unmapped_step_count(spec, space, base_config)
    if found is None:
        return []
    path, value = found
    listed = spec.write_back.get(STEPS_KNOB)
    if listed is None:
        fix = f"add 'max_steps: {path}' under write_back"
    else:
        paths = [listed] if isinstance(listed, str) else list(listed)
        fix = f"list it under write_back: max_steps: [{', '.join([*paths, path])}]"
    return [f"your config's {path} is {value} but every trial runs budget.max_steps = "
            f"{spec.budget.max_steps}: {fix} so the trials and the handed-over configs carry "
            "the steps they ran (a scheduler's total steps too)"]


def new_path_notes(write_back: dict[str, str], base_config: dict[str, Any]) -> list[str]:
    """A note per write-back path the base config does not have (a typo writes a key the
    trainer never reads), with the closest existing path."""
    if not base_config:
        return []
    leaves = leaf_paths(base_config)
    notes = []
    for knob, path in write_back.items():
        if path in leaves:
            continue
        near = difflib.get_close_matches(path, leaves, n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        notes.append(f"write_back.{knob}: '{path}' is not in the base config and will be added "
                     f"to it{hint} (the trainer must read it there)")
    return notes


def _missing_path_error(write_back: dict[str, str], base_config: dict[str, Any],
                        variant: str = "", space: Mapping[str, Any] | None = None,
                        primary: tuple[Path, dict[str, Any]] | None = None) -> SpecError:
    """The first write-back path the base config lacks as a value, as one clear error: a
    section is named as such, a knob whose choices are a Hydra config group's options is
    pointed at the group (``primary``: the Hydra primary config), a typo gets the closest
    path; ``variant``: the group options the config was composed with."""
    leaves = leaf_paths(base_config)
    knob, path = next((k, p) for k, p in write_back.items() if p not in leaves)
    key = f"write_back.{knob}"
    where = f"the base config composed with {variant}" if variant else "the base config"
    group = group_of_choices((space or {}).get(knob), primary_groups(primary[1]),
                             primary[0].parent) if primary else None
    if group is not None and path != group:
        return SpecError(key, f"'{path}' is not in {where}, and the knob's choices are the "
                         f"options of the Hydra config group '{group}'",
                         f"write '{knob}: {group}' to search the group's option (each "
                         "composed with its own file, as `python app.py "
                         f"{group}=…` does)")
    section = get_path(base_config, path, None)
    if isinstance(section, Mapping):
        inner = [leaf for leaf in leaves if leaf.startswith(path + ".")]
        return SpecError(key, f"'{path}' is a section of {where}, not a value, so "
                         "a knob cannot be written there",
                         f"write the knob to one of its keys ({', '.join(inner[:4])}); to "
                         "search a Hydra config group's option, write the knob to the "
                         "group's name as in the defaults list (docs/sweep-file.md)")
    near = _nearest_leaf(knob, path, [leaf for leaf in leaves if leaf not in
                                      set(write_back.values())])
    hint = f"did you mean '{near}'? Else w" if near else "W"
    return SpecError(key, f"'{path}' is not in {where}, so the trainer would never "
                     "see the sampled value",
                     f"{hint}rite the path your trainer reads, add the key to the base "
                     "config, or set 'new_keys: true' in the sweep file to add it (for a "
                     "script driven by argparse flags: add the option to its parser and "
                     "write the defaults file again, or the flag is never read)")


#: Other names the default space's knobs go by in users' configs.
KNOB_ALIASES: dict[str, tuple[str, ...]] = {
    "lr": ("lr", "learning_rate", "base_lr", "max_lr"),
    "weight_decay": ("weight_decay", "wd", "l2"),
    "grad_clip": ("grad_clip", "clip", "gradient_clip_val", "max_grad_norm", "clip_grad"),
    "dropout": ("dropout", "drop", "p_drop", "drop_rate"),
    "warmup": ("warmup", "warmup_steps", "warmup_ratio", "pct_start")}


def _nearest_leaf(knob: str, path: str, leaves: list[str]) -> str | None:
    """The base config's value a write-back ``path`` of ``knob`` most likely meant: one
    whose last key is the path's own or a name the knob goes by (``model.lr`` ->
    ``optim.lr``; ``optim.learning_rate`` -> ``optim.lr``), the closest by spelling among
    them, else the closest path by spelling (``optimm.lr``); none written by another knob.

    Example:
        >>> _nearest_leaf("lr", "model.lr", ["model.dropout", "optim.lr", "optim.wd"])
        'optim.lr'
        >>> _nearest_leaf("lr", "optim.learning_rate", ["optim.lr", "optim.wd"])
        'optim.lr'
    """
    last = path.rpartition(".")[2]
    names = {last, knob, *KNOB_ALIASES.get(knob, ())}
    for alias, spellings in KNOB_ALIASES.items():
        if last in spellings:
            names.update(spellings, {alias})
    same = [leaf for leaf in leaves if leaf.rpartition(".")[2] in names]
    if same:
        return (difflib.get_close_matches(path, same, n=1, cutoff=0.0) or same)[0]
    near = difflib.get_close_matches(path, leaves, n=1)
    return near[0] if near else None


def _kind(value: Any) -> str | None:
    """What a config value is, in words (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, Mapping):
        return "a section"
    return "a list" if isinstance(value, list) else a_type(value)


def _knob_values(knob: _Knob) -> list[Any]:
    """The values a knob writes (its bounds for a range), nulls left out."""
    if isinstance(knob, Categorical):
        values = list(knob.choices)
    elif isinstance(knob, Fixed):
        values = [knob.value]
    else:
        values = [knob.low, knob.high]  # type: ignore[attr-defined]
    return [v for v in values if v is not None]


def _kinds_clash(base: str, knob: set[str]) -> bool:
    """Whether knob values of these kinds cannot be meant for a base value of kind
    ``base``: no number (nor true/false) over a number, nothing but a section or a list
    over one. Numbers over text, text over true/false and int over float stay allowed."""
    if not knob:
        return False
    if base == "a number":
        return not knob & {"a number", "true/false"}
    if base in ("a section", "a list"):
        return base not in knob
    return False


def _value_kind_notes(write_back: dict[str, str], space: dict[str, _Knob],
                      config: dict[str, Any], variant: str = "") -> list[str]:
    """Notes on knobs whose every value is text where the base config has a number: most
    likely the wrong path, and the trainer would crash on it, but a setting may take both
    (Lightning's ``precision: 32`` or ``"16-mixed"``, a ``compile: 0`` read as off), so a
    note, not an error. A SpecError for text that reads as a number (``1e-3``: YAML's
    reading, not the user's meaning), and for scalars over a section or a list."""
    notes: list[str] = []
    leaves = leaf_paths(config)
    for knob, path in write_back.items():
        if knob not in space:
            continue
        base = get_path(config, path, None)
        base_kind = _kind(base)
        values = _knob_values(space[knob])
        kinds = {k for k in map(_kind, values) if k is not None}
        if base_kind is None or base == HYDRA_MISSING or not _kinds_clash(base_kind, kinds):
            continue
        where = f"the base config composed with {variant}" if variant else "the base config"
        shown_base = f"({', '.join(base)})" if isinstance(base, Mapping) else f"({base!r})"
        shown = ", ".join(repr(v) for v in values[:4]) + (", ..." if len(values) > 4 else "")
        kind = " and ".join(sorted("numbers" if k == "a number" else k for k in kinds))
        section = path.rsplit(".", 1)[0] + "." if "." in path else ""
        taken = set(write_back.values())
        near = [p for p in leaves if p != path and p not in taken and p.startswith(section)
                and "." not in p[len(section):] and _kind(get_path(config, p, None)) in kinds]
        if kinds == {"text"} and all(_float_text(v) for v in values):
            raise SpecError(f"search_space.{knob}", f"its values are text ({shown}), not "
                            f"numbers like {path} in {where} ({base!r}): YAML reads a "
                            "number such as 1e-3 without a dot as text",
                            "write the numbers with a dot and a signed exponent (1.0e-3), "
                            "or as decimals (0.001)")
        hint = f" (e.g. {', '.join(near[:3])})" if near else ""
        if base_kind == "a list" and len(base) == 1 and _kind(base[0]) in kinds:
            raise SpecError(f"base_config.{path}", f"{path} in {where} is a list "
                            f"{shown_base} where the knob '{knob}' gives one value "
                            f"({shown})", f"write the value itself, not in a list: {path}: "
                            f"{base[0]!r}")
        if base_kind in ("a section", "a list"):  # a scalar where the trainer reads many
            raise SpecError(f"write_back.{knob}", f"{path} in {where} is {base_kind} "
                            f"{shown_base}, but the knob's values are {kind} ({shown}): the "
                            "path is most likely not the setting the knob is meant for",
                            f"point write_back.{knob} at the key that holds that "
                            f"setting{hint}")
        notes.append(f"write_back.{knob}: {path} in {where} is {base_kind} {shown_base}, "
                     f"but the knob's values are {kind} ({shown}): if the trainer reads "
                     f"{base_kind} there, point write_back.{knob} at the key that holds "
                     f"that setting{hint} (`sweeps try` shows what it makes of it)")
    return notes


def _float_text(value: Any) -> bool:
    """Whether ``value`` is text that reads as a number (``"1e-3"``)."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def _check_initial_points(points: list[dict[str, Any]], space: dict[str, _Knob]) -> None:
    for i, point in enumerate(points):
        for name, value in point.items():
            key = f"initial_points.{i}.{name}"
            knob = space.get(name)
            if knob is None:
                raise SpecError(key, "names no knob of the search space",
                                f"use one of {', '.join(space)}")
            if knob.is_fixed():
                raise SpecError(key, "this knob is fixed", "leave it out of initial_points")
            if not contains(knob, value):
                raise SpecError(key, f"{value!r} is outside the knob's range",
                                "give a value the search space allows")


def _check_compile(knob: _Knob, key: str) -> None:
    values = knob.choices if isinstance(knob, Categorical) else \
        [knob.value] if isinstance(knob, Fixed) else None
    if values is None:
        raise SpecError(key, "compile mode must be categorical or fixed",
                        f"write '{{type: categorical, choices: {list(COMPILE_MODES)}}}'")
    for v in values:
        if v not in COMPILE_MODES:
            raise SpecError(key, f"unknown compile mode {v!r}",
                            f"use one of {', '.join(COMPILE_MODES)}")


#: The values the default space's numeric knobs (and the common ``momentum`` and
#: ``label_smoothing``) can take, as (low, high, low open, high open): an LR at or below 0
#: crashes the optimizer (``Invalid learning rate``), so does a negative momentum; a
#: negative weight decay, clip or warmup is no setting, a dropout is a probability.
KNOWN_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "lr": (0.0, math.inf, True, True), "weight_decay": (0.0, math.inf, False, True),
    "grad_clip": (0.0, math.inf, False, True), "warmup": (0.0, math.inf, False, True),
    "dropout": (0.0, 1.0, False, False), "momentum": (0.0, 1.0, False, False),
    "label_smoothing": (0.0, 1.0, False, False)}


def _check_known_range(name: str, knob: _Knob, key: str) -> None:
    """A SpecError naming the bound or choice of a default-space knob (``lr``, ``dropout``,
    ...) that lies outside the values it can take: a uniform LR from -0.01 passes every
    other check and crashes the trials that draw below 0."""
    if name not in KNOWN_RANGES:
        return
    low, high, low_open, high_open = KNOWN_RANGES[name]
    if isinstance(knob, Categorical):
        where = [(f"{key}.choices", v) for v in knob.choices]
    elif isinstance(knob, Fixed):
        where = [(key, knob.value)]
    else:
        where = [(f"{key}.low", knob.low), (f"{key}.high", knob.high)]  # type: ignore[attr-defined]
    for at, value in where:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        below = value <= low if low_open else value < low
        above = value >= high if high_open else value > high
        if below or above:
            bounds = (f"{'>' if low_open else '>='} {low:g}" if high == math.inf else
                      f"in [{low:g}, {high:g}{')' if high_open else ']'}")
            raise SpecError(at, f"{value!r} is out of range: {name} must be {bounds}",
                            f"make every value of search_space.{name} {bounds}"
                            + (" (a loguniform range keeps it above 0)" if name == "lr" else ""))


#: The knobs of the default search space (``search_spaces/default.yaml``): names the
#: rules and the LR probe know, so of two spellings of one knob these are the right ones.
DEFAULT_KNOBS = ("lr", "grad_clip", "dropout", "weight_decay", "warmup", "compile")


def _check_write_back(write_back: dict[str, str], space: dict[str, _Knob],
                      base_config: dict[str, Any]) -> None:
    for knob in write_back:
        if knob not in space and knob.partition(".")[0] != STEPS_KNOB:
            unmapped = [k for k in space if k not in write_back]
            near = difflib.get_close_matches(knob, unmapped, n=1) or \
                difflib.get_close_matches(knob, list(space), n=1)
            if near and near[0] in unmapped and near[0] not in DEFAULT_KNOBS:
                # two spellings of one knob: the misspelt one is the one sweeps does not
                # know; of two names of your own, either may be
                if knob in DEFAULT_KNOBS:
                    raise SpecError(f"search_space.{near[0]}", f"has no write_back entry, "
                                    f"and write_back maps '{knob}', a knob the search space "
                                    f"lacks", f"did you mean '{knob}'? Use one name in both "
                                    "places")
                raise SpecError(f"write_back.{knob}", "names no knob of the search space, "
                                f"and search_space.{near[0]} has no write_back entry: one "
                                "knob spelt two ways?", f"use one name in both places: "
                                f"rename write_back.{knob} to '{near[0]}', or "
                                f"search_space.{near[0]} to '{knob}'")
            hint = f"did you mean '{near[0]}'?" if near else \
                f"knobs in the search space: {', '.join(space)}."
            raise SpecError(f"write_back.{knob}", "names no knob of the search space",
                            f"{hint} Remove the entry or add the knob to the search space")
    for knob in space:
        if knob not in write_back:
            raise SpecError(f"write_back.{knob}", "missing: every knob needs a path in the "
                            "base config", f"add '{knob}: section.{knob}' under write_back, or "
                            f"drop the knob: '{knob}: null' under search_space")
    targets: dict[str, str] = {}
    for knob, path in write_back.items():
        key = f"write_back.{knob}"
        try:
            split_path(path)
        except ValueError:
            raise SpecError(key, f"{path!r} is not a dotted key path",
                            "write e.g. 'training.lr'") from None
        if path.split(".")[0] == RESERVED_KEY:
            raise SpecError(key, f"'{RESERVED_KEY}' is reserved: it holds the trial's own "
                            "details (trial_id, seed, max_steps, ...)",
                            "write the value somewhere else in the config")
        hit = collision(base_config, path)
        if hit is not None:
            raise SpecError(key, f"'{hit}' in the base config is a "
                            f"{type(_get(base_config, hit)).__name__}, so '{path}' cannot "
                            "be set inside it", f"choose a path that does not pass through "
                            f"'{hit}', or make '{hit}' a mapping")
        for other_knob, other in targets.items():
            if path.startswith(other + "."):  # the other knob's path is a section: its fault
                raise SpecError(f"write_back.{other_knob}", f"'{other}' is a section holding "
                                f"'{path}' (knob {knob}), not a value",
                                _own_leaf(other_knob, other, path))
            if other.startswith(path + "."):
                raise SpecError(key, f"'{path}' is a section holding '{other}' (knob "
                                f"{other_knob}), not a value", _own_leaf(knob, path, other))
            if path == other:
                raise SpecError(key, f"'{path}' is knob {other_knob}'s path too",
                                "give each knob its own leaf path")
        targets[knob] = path


def _own_leaf(knob: str, section: str, taken: str) -> str:
    """The fix for a knob written to a section: a leaf of its own in it, e.g.
    ``lr: optim.lr`` (unless that is the path the other knob takes)."""
    leaf = f"{section}.{knob}"
    return "give each knob its own leaf path" + (
        f", e.g. '{knob}: {leaf}'" if leaf != taken else "")


def _get(config: Mapping[str, Any], path: str) -> Any:
    node: Any = config
    for k in path.split("."):
        node = node[k]
    return node


def _validate(model: Any, data: Any, root: str) -> Any:
    """Validate with pydantic; turn the first error into a SpecError with the key path."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(data)
        return model.model_validate(data)
    except ValidationError as exc:
        if isinstance(model, TypeAdapter):
            kind = data.get("type") if isinstance(data, Mapping) else None
            model = _KNOB_CLASSES.get(kind) if isinstance(kind, str) else None
        raise _spec_error(exc, root, model) from None


def _spec_error(exc: ValidationError, root: str, model: Any) -> SpecError:
    errors = exc.errors(include_url=False)
    err = _misspelt(errors) or errors[0]
    loc = [str(p) for p in err["loc"] if not (isinstance(p, str) and p in KNOB_TYPES)]
    at = (err.get("ctx") or {}).get("at")  # a model's check naming one of its keys
    if at:
        loc.append(str(at))
    key = ".".join([root, *loc] if root else loc) or root or "(top level)"
    etype, msg = err["type"], err["msg"]
    if etype == "extra_forbidden":
        known = _known_fields(model, loc[:-1])
        near = difflib.get_close_matches(loc[-1], known, n=1)
        fix = f"did you mean '{near[0]}'?" if near else "remove it."
        if known:
            fix += f" Known keys here: {', '.join(known)}"
        if loc[-1] == "step" and model in (Uniform, LogUniform):
            fix = ("a float knob takes no step: search it continuously, or list its grid as "
                   "{type: categorical, choices: [...]} (an int knob takes a step)")
        return SpecError(key, "unknown key", fix)
    if etype == "missing":
        return SpecError(key, "missing", "add it (see docs/sweep-file.md)")
    if etype in ("union_tag_invalid", "union_tag_not_found"):
        return SpecError(key if key.endswith(".type") else f"{key}.type",
                         "unknown knob type", f"use one of {', '.join(KNOB_TYPES)}")
    choice = _choice_error(loc, err.get("input"))
    if choice is not None:
        return SpecError(".".join([root, *choice[0]] if root else choice[0]), *choice[1:])
    fix = (err.get("ctx") or {}).get("fix") or _value_fix(model, loc, err.get("input"))
    # "a valid number, unable to parse string as a number": what to give is before the comma
    wanted = msg.removeprefix("Input should be ").split(", unable to")[0]
    if wanted != msg and "fix" not in (err.get("ctx") or {}):  # say what to give first
        fix = f"give a value that is {wanted.rstrip('.')} ({fix})"
    if etype == "list_type" and not isinstance(err.get("input"), (dict, list)):
        fix = f"write a list, e.g. [{err.get('input')}]"
    if etype == "value_error":
        return SpecError(key, msg.removeprefix("Value error, "), fix)
    return SpecError(key, msg[0].lower() + msg[1:], fix)


def _misspelt(errors: list[Any]) -> Any:
    """The unknown key beside a missing one (``hgih`` where ``high`` is missing): the typo
    is the error to name, not the key it left missing."""
    missing = [e["loc"][:-1] for e in errors if e["type"] == "missing"]
    return next((e for e in errors if e["type"] == "extra_forbidden"
                 and e["loc"][:-1] in missing), None)


def _choice_error(loc: list[str], given: Any) -> tuple[list[str], str, str] | None:
    """A categorical choice that is a list or mapping: (key path, problem, fix), else None.

    Pydantic names each scalar type it tried (``choices.0.bool``); the user needs to hear
    that a choice is one value."""
    at = next((i for i, p in enumerate(loc) if p == "choices"), None)
    if at is None or at + 1 >= len(loc) or not loc[at + 1].isdigit() or \
            not isinstance(given, (list, dict)):
        return None
    kind = "list" if isinstance(given, list) else "mapping"
    return (loc[: at + 2], f"a choice is one value (a number, string, true/false or null), "
            f"not a {kind} like {given!r}",
            "name each choice with a string (e.g. choices: [adam_default, adam_095]) and map "
            "the name to its value in your trainer, or search each number as a knob of "
            "its own")


def _value_fix(model: Any, loc: list[str], given: Any) -> str:
    """What was given and what the key means (its description), for a value's error."""
    about = None
    for name in (p for p in loc if not p.isdigit()):
        fields = getattr(model, "model_fields", {}) if model is not None else {}
        field_info = fields.get(name)
        if field_info is None:
            about = None
            break
        about = field_info.description
        ann = field_info.annotation
        args = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type)]
        candidates = [ann, *args] if isinstance(ann, type) else args
        model = next((c for c in candidates if issubclass(c, BaseModel)), None)
    shown = "" if given is None or isinstance(given, (dict, list)) else f"you gave {given!r}"
    named = ".".join(loc)
    parts = [p for p in (shown, f"{named} means: {about}" if about else "") if p]
    return "; ".join(parts) or "give a value of the kind docs/sweep-file.md lists"


def _known_fields(model: Any, loc: list[str]) -> list[str]:
    """Field names of the pydantic model found by walking ``loc`` down from ``model``."""
    for part in loc:
        if part.isdigit():
            continue
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return []
        ann = fields[part].annotation
        args = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type)]
        candidates = [ann, *args] if isinstance(ann, type) else args
        model = next((c for c in candidates if issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))
