"""Racing inside the search: the configs at the top re-run on fresh seeds while it goes on.

A fixed holdback after the search spends the same steps whatever the trainer turns out
to be, learns nothing from its verdicts in time to search elsewhere, and can run out
before anything held. Here, as in SMAC's intensifier, evidence is gathered while the
search runs, from the same workers and the same ``budget.total_steps``:

- **Who races.** The base config's own values (the search's first trial) from the start,
  and the best ``confirm.keep`` of the search trials that finished ``ok`` and have not
  failed a fresh seed, ranked by their mean quality over every seed they ran. A trial
  that finishes among them enters the race; one pushed out of them stops gaining seeds
  (it fell behind). At most ``confirm.max_candidates`` search trials ever start a race.
- **What each runs**, one run at a time (:func:`sweeps.results.confirm.ladder`): the first
  fresh seed (the screen), the LR probe, then the other fresh seeds; a failed probe asks
  for ``confirm.narrow_seeds`` fresh seeds instead of vetoing the config. The first
  unstable seed, or a quality gap past ``confirm.tolerance``, drops it at once.
- **When.** While the search goes on, screens only, one at a time: the base config's,
  and the leader's challenger (the best search trial not screened yet, when it is the
  best by its estimate and ahead of the base config's), as SMAC races challengers
  against its incumbent. Once any
  config failed a fresh seed (the seeds disagree: a region is fragile), every contender
  is screened, so a fragile config is caught while there is budget to search elsewhere;
  where the seeds agree the evidence goes to the config that is handed over, and most
  of the budget to the search. The rest of the ladder waits for the search to stop, when
  the race gets every worker and the leader (the best mean over its seeds) is known:
  evidence is not spent on leaders the search overtakes. A new search trial starts only
  while the steps left cover settling the current leader (its missing re-runs, and the
  base config's fresh seeds when its values lie off the search space), so a
  run ends with its best config settled; :func:`sweeps.results.confirm.select` settles
  what is left within the budget.

The race is a function of the trial book alone (no state of its own), so a resumed
driver picks it up where the journal left it.
"""

from __future__ import annotations

from typing import Any

from sweeps.protocol import OK, PRUNED, ROLE_KEY, SEARCH, SEED_KEY
from sweeps.record import objectives as objs
from sweeps.record.book import TrialBook, TrialRecord
from sweeps.results.confirm import (
    Confirmation,
    base_point,
    base_trial,
    by_estimate,
    judge,
    ladder,
    ladder_cost,
    plan_base,
    raced,
    run_cost,
)
from sweeps.results.front import guess_floor
from sweeps.spec.loader import Sweep


def owner_of(role: str) -> str | None:
    """The candidate a race run belongs to (``confirm:<id>``, ``probe:<id>``), else None.

    Example:
        >>> owner_of("confirm:3b2c870b"), owner_of("search")
        ('3b2c870b', None)
    """
    kind, _, owner = role.partition(":")
    return owner if kind in ("confirm", "probe") and owner else None


class Race:
    """Which configs race now and what each runs next, read from ``book`` (see module)."""

    def __init__(self, sweep: Sweep, book: TrialBook) -> None:
        self.sweep, self.book = sweep, book
        self._key: tuple[int, int] | None = None
        self._contenders: list[TrialRecord] = []
        self._disagreed_key: tuple[int, int] | None = None
        self._disagreed = False

    @property
    def active(self) -> bool:
        """Whether the sweep races at all (fresh seeds or an LR probe are planned)."""
        conf = self.sweep.spec.confirm
        return conf.seeds > 0 or (conf.lr_probe > 0 and "lr" in self.sweep.space)

    def _book_key(self) -> tuple[int, int]:
        """What the cached answers depend on: the trials recorded, and how many finished."""
        return len(self.book.trials), sum(r.finished for r in self.book.trials.values())

    def judge(self, rec: TrialRecord) -> Confirmation:
        return judge(self.sweep, self.book, rec, on_front=True)

    def contenders(self) -> list[TrialRecord]:
        """The search trials in the race now, the base config's first, then best first."""
        key = self._book_key()
        if key != self._key:
            self._key, self._contenders = key, self._rank()
        return list(self._contenders)

    def _rank(self) -> list[TrialRecord]:
        if not self.active:
            return []
        conf, quality = self.sweep.spec.confirm, self.sweep.objectives[0]
        sign = 1.0 if quality.mode == "min" else -1.0
        base = base_trial(self.sweep, self.book)
        search = [r for r in self.book.trials.values() if r.role == SEARCH]
        floor = guess_floor(self.book, search, quality)  # learnt nothing: no fresh seed
        ranked: list[tuple[float, TrialRecord]] = []
        for rec in search:
            if not rec.finished or rec.status != OK or rec is base:
                continue
            own = objs.metric_value(rec.history, quality.metric)
            if floor is not None and own is not None and sign * own >= floor:
                continue
            judged = self.judge(rec)
            mean = judged.estimate
            if judged.verdict == "fragile" or mean is None:
                continue
            ranked.append((sign * mean, rec))
        ranked.sort(key=lambda vr: vr[0])
        started = sum(raced(self.book, r) for r in self.book.trials.values()
                      if r.role == SEARCH and r is not base)
        top: list[TrialRecord] = []
        for _, rec in ranked:
            if len(top) == conf.keep:
                break
            if raced(self.book, rec) or started < conf.max_candidates:
                started += not raced(self.book, rec)
                top.append(rec)
        if base is not None and base.finished and base.status in (OK, PRUNED) and \
                not base.flagged and self.judge(base).verdict != "fragile":
            top.insert(0, base)
        return top

    def disagreed(self) -> bool:
        """Whether a search trial the race ran (the base config's included) is ``fragile``:
        it failed a fresh seed, or its seeds disagreed past ``confirm.tolerance``."""
        key = self._book_key()
        if self._disagreed_key != key:
            self._disagreed_key = key
            self._disagreed = any(
                rec.role == SEARCH and raced(self.book, rec)
                and self.judge(rec).verdict == "fragile" for rec in self.book.trials.values())
        return self._disagreed

    def screening(self) -> list[TrialRecord]:
        """The contenders screened while the search runs, best estimate first: every one
        once the seeds disagreed (:meth:`disagreed`), else the base config and the best
        search trial by its estimate (the leader, or its challenger) when it is ahead of
        the base config's estimate: a config that trails what the user already has is
        not handed over, so it earns no fresh seed while the search goes on."""
        ranked = self.by_estimate()
        if self.disagreed():
            return ranked
        base = base_trial(self.sweep, self.book)
        found = [r for r in ranked if r is not base]
        ids = [r.trial_id for r in ranked]
        if found and base is not None and base.trial_id in ids and \
                ids.index(base.trial_id) < ids.index(found[0].trial_id):
            found = []  # the base config leads: nothing challenges it yet
        return [r for r in ranked if r is base or (found and r is found[0])]

    def wants(self, rec: TrialRecord) -> bool:
        """Whether a finished search trial is screened now (its tell to Optuna waits for
        its first fresh seed)."""
        return any(r.trial_id == rec.trial_id for r in self.screening())

    def by_estimate(self) -> list[TrialRecord]:
        """The contenders by their mean quality over the seeds they ran, best first."""
        return by_estimate(self.sweep, self.book, self.contenders())

    def leader(self) -> TrialRecord | None:
        """The contender with the best mean quality over the seeds it ran."""
        ranked = self.by_estimate()
        return ranked[0] if ranked else None

    def next_run(self, busy: set[str], searching: bool = False) -> dict[str, Any] | None:
        """The next re-run: the first missing rung of the best contender (by its mean so
        far) with no run in flight (``busy``: the candidates with one), or None. While
        ``searching``, screens of :meth:`screening` only: the first fresh seed catches a
        fragile config at once, and the rest of the evidence waits for the search to
        stop, when the leader is known (the search leaves the steps it needs,
        :meth:`reserve`) instead of going to leaders it overtakes. After it, the
        leader's runs come first and alone (the steps left are its own), then the
        others' by their estimate."""
        ranked = self.by_estimate()
        if not searching and ranked:  # the leader is settled first, nothing beside it
            missing = ladder(self.sweep, self.book, ranked[0])
            if missing:
                return None if ranked[0].trial_id in busy else missing[0]
        for rec in self.screening() if searching else ranked:
            if rec.trial_id in busy:
                continue
            missing = ladder(self.sweep, self.book, rec)
            if missing and (not searching or _is_screen(self.sweep, missing[0])):
                return missing[0]
        return None

    def base_steps(self) -> int:
        """Steps the base config's runs on the fresh seeds will take after the search, when
        its values lie off the search space (:func:`plan_base`); 0 when it is a search
        trial or they ran."""
        if base_point(self.sweep) is not None:
            return 0
        return sum(run_cost(self.sweep, r) for r in plan_base(self.sweep, self.book))

    def reserve(self) -> int:
        """Steps the search leaves for settling the leader (the contender with the best
        mean over its seeds): its missing re-runs (:func:`ladder_cost`), 0 once settled;
        and, when the base config's own values lie off the search space, its runs on the
        fresh seeds after the search (:meth:`base_steps`)."""
        steps = self.base_steps()
        leader = self.leader()
        if leader is not None:
            steps += ladder_cost(self.sweep, self.book, leader)
        return steps

    def tell_value(self, rec: TrialRecord) -> float | None:
        """What the sampler is told of a raced config's quality: its mean over every seed
        it ran stable (None while it has run no fresh seed or probe)."""
        judged = self.judge(rec)
        if not judged.runs and judged.probe is None:
            return None
        return judged.estimate


def _is_screen(sweep: Sweep, run: dict[str, Any]) -> bool:
    """Whether a re-run is a candidate's first fresh seed."""
    return run[ROLE_KEY].startswith("confirm:") and run[SEED_KEY] == sweep.spec.seed + 1
