"""Which knobs mattered, and which were barely tried.

Importance comes from the sweep's Optuna study (``optuna.journal`` beside the results),
computed by Optuna's PED-ANOVA evaluator for two targets: the quality objective over the
trials that finished ok, and the stable/unstable outcome (the ``stability`` constraint the
sampler learns from). Under-explored choices come from trials.csv and the search space, so
they are found for folders without a journal too.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.trial import FrozenTrial, TrialState

from sweeps.protocol import OK, STABILITY_CONSTRAINT
from sweeps.state.layout import STUDY_FILE

CONSTRAINT = STABILITY_CONSTRAINT
EVALUATOR = "PED-ANOVA"
WHY = ("Optuna's default importance evaluator (optuna.importance.PedAnovaImportanceEvaluator): "
       "it needs no scikit-learn (fANOVA does), takes milliseconds where fANOVA's random "
       "forest takes about a second, and asks what sets the best trials apart from the rest, "
       "which suits a sweep of tens of trials")
MIN_TRIALS = 8  # trials a target needs before its importances say anything
#: Stable and unstable trials each, for the stability target: with two unstable trials
#: the ranking of two identical sweeps flipped (weight_decay and dropout first in one,
#: grad_clip and lr in the other); a ranking needs as many events as the quality one.
MIN_CLASS = 5
TOP_TRIALS, TOP_SHARE = 5, 0.1  # the quality target's top set: best 5 or best 10 %
FEW_TRIALS, FAIR_SHARE = 3, 0.2  # a choice tried fewer times (or below this share) is warned
EDGE = 0.1  # a numeric knob whose samples never came within this share of an end

optuna.logging.set_verbosity(optuna.logging.WARNING)  # as sweeps.tune.searcher: no line per study


def open_study(folder: Path, name: str) -> tuple[optuna.Study | None, str]:
    """The sweep's study read from ``folder/optuna.journal`` (never written), or None and
    one line saying why not."""
    path = Path(folder) / STUDY_FILE
    if not path.is_file():
        return None, f"no {STUDY_FILE} in this folder (a sweep from an older version, or " \
            "the file was not copied with the results)"
    try:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(path)))
        names = [s.study_name for s in storage.get_all_studies()]
        pick = name if name in names else names[0] if len(names) == 1 else None
        if pick is None:
            return None, f"{STUDY_FILE} holds no study named {name!r} (it holds " \
                f"{', '.join(names) or 'none'})"
        return optuna.load_study(study_name=pick, storage=storage), ""
    except Exception as exc:  # a cut or garbled journal: the report goes on without it
        return None, f"cannot read {STUDY_FILE}: {type(exc).__name__}: {exc}"[:300]


def _rank(trials: list[FrozenTrial], values: list[float], top: int,
          direction: optuna.study.StudyDirection) -> dict[str, float]:
    """PED-ANOVA importances of the knobs that vary among ``trials`` for ``values``, the
    ``top`` best (lowest for MINIMIZE) being the set to explain."""
    study = optuna.create_study(direction=direction)
    for trial, value in zip(trials, values, strict=True):
        study.add_trial(optuna.trial.create_trial(
            params=trial.params, distributions=trial.distributions, value=value))
    varied = sorted({k for t in trials for k in t.params
                     if len({repr(u.params.get(k)) for u in trials}) > 1})
    if not varied:
        return {}
    evaluator = PedAnovaImportanceEvaluator(target_quantile=(top - 0.5) / len(trials))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = get_param_importances(study, evaluator=evaluator, params=varied,
                                      normalize=False)
    total = sum(found.values())
    return {k: float(v) / total for k, v in found.items()} if total > 0 else {}


def quality(study: optuna.Study, metric: str) -> dict[str, Any]:
    """Importance for the first objective over the trials that finished ok."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("status") == OK and t.values
            and math.isfinite(t.values[0])]
    out: dict[str, Any] = {"metric": metric, "trials": len(done), "importances": {}, "note": ""}
    if len(done) < MIN_TRIALS:
        out["note"] = f"too few trials finished ok ({len(done)}; needs {MIN_TRIALS})"
        return out
    values = [t.values[0] for t in done]
    if max(values) == min(values):
        out["note"] = f"every ok trial reached the same {metric}"
        return out
    top = min(len(done) - 1, max(TOP_TRIALS, math.ceil(TOP_SHARE * len(done))))
    out["top"] = top
    out["importances"] = _rank(done, values, top, study.directions[0])
    if not out["importances"]:
        out["note"] = "no knob took more than one value among the ok trials"
    return out


def stability(study: optuna.Study) -> dict[str, Any]:
    """Importance for the stable/unstable outcome: the ``stability`` constraint of every
    trial that finished (ok, unstable, crashed, pruned; a pruned trial the rules diagnosed
    counts as unstable, as the sampler was told). A config that proved fragile on a fresh
    seed counts once, as unstable: the study holds it twice (its search trial, told
    before the fresh seed, and the infeasible trial added at the same point); ``fragile``
    counts those among the unstable, as the race judged them when it told the sampler."""
    done = [t for t in study.get_trials(deepcopy=False,
                                        states=(TrialState.COMPLETE, TrialState.PRUNED))
            if CONSTRAINT in t.constraints]
    retold = {t.user_attrs["race_of"] for t in done if "race_of" in t.user_attrs}
    done = [t for t in done if t.number not in retold]
    bad = [float(t.constraints[CONSTRAINT] > 0) for t in done]
    stable, unstable = len(bad) - int(sum(bad)), int(sum(bad))
    fragile = sum(1 for t in done if t.constraints[CONSTRAINT] > 0
                  and t.user_attrs.get("status") == "fragile")
    out: dict[str, Any] = {"trials": len(done), "stable": stable, "unstable": unstable,
                           "fragile": fragile, "importances": {}, "note": ""}
    if not unstable:
        out["note"] = "no trial was unstable: nothing sets stable trials apart"
    elif not stable:
        out["note"] = "no trial was stable: nothing sets stable trials apart"
    elif len(done) < MIN_TRIALS or min(stable, unstable) < MIN_CLASS:
        out["note"] = f"too few trials ({stable} stable, {unstable} unstable; needs " \
            f"{MIN_TRIALS} in all and {MIN_CLASS} of each)"
    else:  # the stable trials are the set to explain: 0 (stable) is the better value
        out["importances"] = _rank(done, bad, stable, optuna.study.StudyDirection.MINIMIZE)
        if not out["importances"]:
            out["note"] = "no knob took more than one value"
    return out


def _key(v: Any) -> Any:
    """A value as trials.csv and the search space both spell it (1 == 1.0 == "1")."""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, str) and v in ("True", "False"):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _edges(knob: str, entry: dict[str, Any], values: pd.Series) -> list[dict[str, Any]]:
    """A numeric knob's range ends no sample came near (within ``EDGE`` of the range)."""
    low, high = entry.get("low"), entry.get("high")
    values = pd.to_numeric(values, errors="coerce").dropna()
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)) or \
            high <= low or not len(values):
        return []
    log = entry.get("type") == "loguniform" or entry.get("log")
    scale = (lambda x: math.log(x)) if log and low > 0 else (lambda x: x)
    if log and (low <= 0 or values.min() <= 0):
        return []
    span = scale(high) - scale(low)
    lo, hi = (scale(values.min()) - scale(low)) / span, (scale(high) - scale(values.max())) / span
    out = []
    for side, gap, tried, end in (("low", lo, values.min(), low), ("high", hi, values.max(), high)):
        if gap > EDGE:
            word = "below" if side == "low" else "above"
            out.append({"knob": knob, "edge": side, "tried": float(tried), "bound": end,
                        "text": f"{knob}: nothing {word} {tried:.3g} was tried (the range "
                                f"goes to {end:.3g})"})
    return out


def under_explored(search: pd.DataFrame, space: dict[str, dict[str, Any]]) -> list[dict]:
    """Categorical choices the search barely tried (fewer than ``FEW_TRIALS`` trials or
    ``FAIR_SHARE`` of an even split), then numeric range ends it never came near."""
    out: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for knob, entry in space.items():
        if knob not in search or not len(search):
            continue
        kind = entry.get("type")
        if kind == "categorical" and len(entry.get("choices") or []) > 1:
            choices = entry["choices"]
            tried = search[knob].dropna().map(_key).value_counts()
            n, fair = int(search[knob].notna().sum()), len(search) / len(choices)
            for choice in choices:
                count = int(tried.get(_key(choice), 0))
                if count < FEW_TRIALS or count < FAIR_SHARE * fair:
                    said = "never ran" if not count else f"ran in {count} of {n} trials"
                    out.append({"knob": knob, "choice": choice, "trials": count, "of": n,
                                "text": f"{knob}={choice} {said}; the sweep says little "
                                        "about it"})
        elif kind in ("uniform", "loguniform", "int"):
            edges += _edges(knob, entry, search[knob])
    return out + edges


def importance(folder: Path, name: str, objectives: list[str], search: pd.DataFrame,
               space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The knob-importance panel as plain data (``sweeps report --format json``'s
    ``importance``): evaluator, why, per-target results (or a note why none), under-explored
    choices."""
    study, why_not = open_study(folder, name)
    targets: dict[str, Any] = {}
    if study is not None:
        try:
            targets = {"quality": quality(study, objectives[0] if objectives else "quality"),
                       "stability": stability(study)}
        except Exception as exc:  # an odd study (say, a space changed mid-sweep)
            why_not = f"importance failed: {type(exc).__name__}: {exc}"[:300]
            targets = {}
    return {"evaluator": EVALUATOR, "why": WHY, "note": why_not, "targets": targets,
            "under_explored": under_explored(search, space)}
