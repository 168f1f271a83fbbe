"""Did an LR probe that held early miss a late failure? Re-run each one to full length.

The race's LR probe ends *held* once the rules could tell (``sweeps/trial/horizon.py``),
not at its last step. For every such probe in the given results folders (e.g. the
``bench/efficiency.py`` runs' folders under ``$BENCH_SCRATCH/efficiency``), this runs the
same config, seed and LR × probe to ``budget.max_steps`` in this process with the rules
only watching (``run_trainer(observe=True)``) and prints whether a rule fired after the
probe's hold step.

    .venv/bin/python bench/probe_hold_check.py /tmp/sweeps-bench/efficiency/eff-direction-mlp-[0-9]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import table

from sweeps.protocol import LR_SCALE_KEY, ROLE_KEY, SEED_KEY
from sweeps.record.book import books_of, open_book
from sweeps.state import saved_sweep
from sweeps.trial.run import prepare_process, run_trainer


def check(folder: Path) -> list[dict]:
    """One row per probe of ``folder`` that held before ``budget.max_steps``."""
    sweep = saved_sweep.read(folder)
    prepare_process(sweep, 1, shared_cache=False)
    with books_of(sweep):
        book = open_book(sweep)
        trials = dict(book.trials)
    rows = []
    for rec in trials.values():
        if not (rec.role.startswith("probe:") and rec.finished and rec.status == "ok"
                and rec.last_step < sweep.spec.budget.max_steps):
            continue
        owner = trials[rec.role.split(":", 1)[1]]  # the probe's own values hold the LR × scale
        config = {**owner.values, SEED_KEY: rec.seed, LR_SCALE_KEY: rec.lr_scale,
                  ROLE_KEY: rec.role}
        verdict = run_trainer(sweep, config, "hold-check", lambda _: None,
                              observe=True).verdict
        rows.append({"folder": folder.name, "probe": rec.role, "held at": rec.last_step,
                     "full length": "held" if verdict is None else
                     f"{verdict.reason} at {verdict.step}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="sweeps results folders")
    args = ap.parse_args()
    rows = [row for folder in args.folders for row in check(folder)]
    print(table(rows))
    late = sum(r["full length"] != "held" for r in rows)
    print(f"{late} of {len(rows)} early holds failed later")


if __name__ == "__main__":
    main()
