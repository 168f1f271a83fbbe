"""Pareto selection of the stable trials, with Optuna's own Pareto helper."""

from __future__ import annotations

import optuna

from sweeps.book import TrialBook, TrialRecord
from sweeps.spec import Objective


def pareto_front(book: TrialBook, records: list[TrialRecord],
                 objectives: list[Objective]) -> list[TrialRecord]:
    """Non-dominated trials among ``records`` that finished ``ok``, best quality first.

    Trials missing an objective value are left out. With one objective the
    front is the single best trial.
    """
    candidates = []
    for rec in records:
        if rec.status != "ok":
            continue
        values = book.objective_values(rec, objectives)
        if any(v is None for v in values):
            continue
        candidates.append((rec, [float(v) for v in values]))
    if not candidates:
        return []
    directions = ["minimize" if o.mode == "min" else "maximize" for o in objectives]
    study = optuna.create_study(directions=directions)
    for i, (_, values) in enumerate(candidates):
        study.add_trial(optuna.trial.create_trial(
            values=values, params={}, distributions={}, user_attrs={"index": i}))
    front = [candidates[t.user_attrs["index"]] for t in study.best_trials]
    sign = 1.0 if objectives[0].mode == "min" else -1.0
    front.sort(key=lambda rv: tuple(sign * v if j == 0 else 0.0 for j, v in enumerate(rv[1])))
    return [rec for rec, _ in front]
