"""A finished sweep's results folder read leniently, for the report and its summary: the
trials, the front, the knobs and how they were searched."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sweeps.protocol import (
    OBJECTIVE_PREFIX,
    PRUNED,
    PRUNED_LABEL_PREFIX,
    SEARCH,
    WARM_START,
)
from sweeps.results.export import handed_over
from sweeps.results.files import cell_text
from sweeps.state.layout import SELECTION_NOTES

META = ("trial_id", "role", "status", "reason", "stop_step", "seed", "steps", "retries")
MAX_FAILED_CURVES, MAX_TOP_CURVES = 8, 5
SAFE_ID = re.compile(r"[A-Za-z0-9_.-]+")
PLOT_GLOBS = ("pareto.png", "seeds.png", "stability-*.png", "curves-*.png")



@dataclass
class Results:
    """A finished sweep folder, read leniently."""

    folder: Path
    name: str
    trials: pd.DataFrame
    pareto: pd.DataFrame
    objectives: list[str]
    modes: dict[str, str]
    knobs: list[str]
    kinds: dict[str, str]
    stable: list[str]
    seed: int = 0
    baseline: float | None = None
    space: dict[str, dict[str, Any]] = field(default_factory=dict)  # knob -> its entry
    notes: list[str] = field(default_factory=list)  # why confirmation stopped early, if it did
    #: Each objective's declared random-guess ``baseline`` (objectives[].baseline).
    baselines: dict[str, float] = field(default_factory=dict)

    @property
    def categorical(self) -> set[str]:
        return {k for k, kind in self.kinds.items() if kind == "categorical"}

    @property
    def search(self) -> pd.DataFrame:
        return self.trials[self.trials["role"] == SEARCH]

    @property
    def reruns(self) -> pd.DataFrame:
        return self.trials[~self.trials["role"].isin([SEARCH, WARM_START])]

    @property
    def warm(self) -> pd.DataFrame:
        """Trials taken from an earlier sweep (``--warm-start``): never run here."""
        return self.trials[self.trials["role"] == WARM_START]


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV file sweeps wrote, its header as the names it was given (:func:`cell_text`)."""
    try:  # trial ids are text: Ray's hex ids are sometimes all digits, even with a leading 0
        frame = pd.read_csv(path, dtype={"trial_id": str})
    except (FileNotFoundError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return pd.DataFrame()
    return frame.rename(columns=cell_text)


def _knobs(trials: pd.DataFrame, space: dict[str, Any], resolved: bool) -> list[str]:
    """Knob columns: the resolved search space's, else those the spec names and the columns
    between the trial's bookkeeping and the first objective."""
    if resolved:
        return [c for c in trials.columns if c in space]
    cols = [c for c in trials.columns if c not in META]
    first = next((i for i, c in enumerate(cols) if c.startswith(OBJECTIVE_PREFIX)), 0)
    return [c for c in cols if c in space or cols.index(c) < first]


def _space_kinds(spec: dict[str, Any], folder: Path
                 ) -> tuple[dict[str, str], bool, dict[str, dict[str, Any]]]:
    """knob -> "log" | "linear" | "categorical" | "fixed", whether ``extends`` and
    search-space files could be resolved (else only what sweep.yaml itself names), and
    each knob's entry (type, choices, low, high)."""
    raw, resolved = spec.get("search_space"), False
    kinds = {}
    try:  # resolves ``extends`` like the sweep did; the files may have moved since
        from sweeps.spec.loader import load_sweep_dict

        data = {k: v for k, v in spec.items() if k != "source"}
        base = Path(str(spec.get("source") or folder / "sweep.yaml")).parent
        space = load_sweep_dict(data, base_dir=base, workdir=base, import_trainer=False).space
        raw, resolved = {k: knob.model_dump() for k, knob in space.items()}, True
    except Exception:  # fall back to what sweep.yaml itself says
        pass
    entries = {k: v for k, v in (raw if isinstance(raw, dict) else {}).items()
               if isinstance(v, dict) and "type" in v}
    for knob, entry in entries.items():
        kind = entry["type"]
        kinds[knob] = ("log" if kind == "loguniform" or entry.get("log") else
                       kind if kind in ("categorical", "fixed") else "linear")
    return kinds, resolved, entries


def _kind(values: pd.Series, declared: str | None) -> str:
    """How a knob's values are laid out on a plot axis (declared, else guessed)."""
    if declared in ("log", "linear", "categorical"):
        return declared
    if values.dtype == bool or not pd.api.types.is_numeric_dtype(values):
        return "categorical"
    distinct = values.dropna().nunique()
    return "categorical" if distinct <= 5 and len(values) > 2 * distinct else "auto"


def load(folder: Path, name: str | None = None, objectives: list[str] | None = None) -> Results:
    """Read trials.csv, pareto.csv, sweep.yaml and stable/ (any of them may be missing)."""
    folder = Path(folder)
    try:
        spec = yaml.safe_load((folder / "sweep.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        spec = {}
    spec = spec if isinstance(spec, dict) else {}
    declared, resolved, entries = _space_kinds(spec, folder)
    objs = [o for o in spec.get("objectives") or [] if isinstance(o, dict) and "metric" in o]
    modes = {str(o["metric"]): str(o.get("mode", "min")) for o in objs}
    trials = read_csv(folder / "trials.csv")
    for col in META:
        if col not in trials:
            trials[col] = pd.Series(dtype=object)
    trials["reason"] = trials["reason"].fillna("").astype(str)
    trials["diagnosis"] = trials["diagnosis"].fillna("").astype(str) \
        if "diagnosis" in trials else ""
    trials["status"] = trials["status"].fillna("").astype(str)
    trials["role"] = trials["role"].fillna(SEARCH).astype(str)
    trials["trial_id"] = trials["trial_id"].astype(str)
    if objectives is None:  # step_time may have been added by the loader: see the columns
        objectives = list(modes) + [c.removeprefix(OBJECTIVE_PREFIX) for c in trials
                                    if c.startswith(OBJECTIVE_PREFIX)
                                    and c.removeprefix(OBJECTIVE_PREFIX) not in modes]
    pareto = read_csv(folder / "pareto.csv")
    if len(pareto):
        pareto["trial_id"] = pareto["trial_id"].astype(str)
        conf = pareto["confirmed"] if "confirmed" in pareto else pd.Series(True, pareto.index)
        pareto["confirmed"] = conf.astype(str).str.lower().isin(["true", "1", "1.0"])
        if "front_rank" not in pareto:
            pareto["front_rank"] = range(1, len(pareto) + 1)
        pareto = pareto.sort_values("front_rank")
    knobs = _knobs(trials, declared, resolved)
    kinds = {k: _kind(trials[k], declared.get(k)) for k in knobs}
    stable = [f"stable/{p.name}" for p in handed_over(folder / "stable")]
    seed = spec.get("seed", 0)
    rules = spec.get("rules") if isinstance(spec.get("rules"), dict) else {}
    baseline = rules.get("baseline_loss")
    return Results(folder, name or str(spec.get("name") or folder.name), trials, pareto,
                   list(objectives), modes, knobs, kinds, stable,
                   seed if isinstance(seed, int) else 0,
                   float(baseline) if isinstance(baseline, (int, float)) else None,
                   {k: v for k, v in entries.items() if k in knobs}, _notes(folder),
                   {str(o["metric"]): float(o["baseline"]) for o in objs
                    if isinstance(o.get("baseline"), (int, float))
                    and not isinstance(o.get("baseline"), bool)})


#: Why confirmation stopped before ``confirm.keep`` configs held (one line each).


def _notes(folder: Path) -> list[str]:
    path = folder / SELECTION_NOTES
    if not path.is_file() or path.is_symlink():
        return []
    return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][:20]


def plain_value(v: Any) -> Any:
    """A JSON-safe Python value: NaN -> None, ±inf -> "inf"/"-inf", numpy -> builtin."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if v is pd.NA or v is None:
        return None
    if isinstance(v, float):
        return None if math.isnan(v) else (("inf" if v > 0 else "-inf") if math.isinf(v) else v)
    return v


def _knob_stats(values: pd.Series, categorical: bool) -> dict[str, Any]:
    present = values.dropna()
    if not len(present):
        return {}
    if categorical or not pd.api.types.is_numeric_dtype(present):
        counts = present.value_counts()
        return {"most_common": plain_value(counts.index[0]), "count": int(counts.iloc[0]),
                "of": int(len(present))}
    return {"median": plain_value(present.median()), "min": plain_value(present.min()),
            "max": plain_value(present.max())}


def _labels(trials: pd.DataFrame) -> pd.Series:
    """A trial's failure label: its reason, or ``pruned · <rule>`` for a pruned trial the
    rules diagnosed (the rule is the diagnosis's first word), else ""."""
    diagnosed = (trials["status"] == PRUNED) & (trials["diagnosis"] != "")
    rule = trials["diagnosis"].str.split(" ").str[0]
    return trials["reason"].where(~diagnosed, PRUNED_LABEL_PREFIX + rule)


def taxonomy(res: Results) -> list[dict[str, Any]]:
    """Failure reasons among search trials, most common first, with the settings behind
    them; pruned trials the rules diagnosed come after, as ``pruned · <rule>``."""
    search = res.search.assign(label=_labels(res.search))
    failed = search[search["label"] != ""]
    rerun = res.reruns[res.reruns["reason"] != ""]["reason"].value_counts()
    out = []
    counts = failed["label"].value_counts()
    order = [k for k in counts.index if not k.startswith(PRUNED)] + \
        [k for k in counts.index if k.startswith(PRUNED)]
    for reason in order:
        part = failed[failed["label"] == reason]
        stop = pd.to_numeric(part["stop_step"], errors="coerce")
        if stop.isna().all():  # pruned: the step its history ends at
            stop = pd.to_numeric(part["steps"], errors="coerce")
        out.append({"reason": reason, "trials": int(counts[reason]),
                    "in_reruns": int(rerun.get(reason, 0)),
                    "status": part["status"].mode().iloc[0],
                    "stop_step": _knob_stats(stop, False),
                    "knobs": {k: _knob_stats(part[k], k in res.categorical) for k in res.knobs}})
    for reason, count in rerun.items():
        if reason not in set(failed["label"]):
            out.append({"reason": reason, "trials": 0, "in_reruns": int(count),
                        "status": "", "stop_step": {}, "knobs": {}})
    return out
