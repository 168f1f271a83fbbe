"""``sweeps audit DIR``: its command line (the audit itself is :mod:`sweeps.results.audit`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sweeps.results.audit import DEFAULT_MARGIN, DEFAULT_SAMPLE, run_audit


def cmd_audit(args: argparse.Namespace) -> int:
    run_audit(Path(args.dir), sample=args.sample, steps=args.steps, pruned=args.pruned,
              margin=args.margin, trust_state=args.trust_state)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``audit`` on the CLI's subparsers."""
    p = sub.add_parser("audit", help="re-run the trials the rules stopped to full length and "
                                     "measure how often a stop was a false alarm")
    p.add_argument("dir", help="the sweep's results folder, e.g. results/direction-demo")
    p.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                   help=f"most stopped trials to re-run, round-robin over the reasons "
                        f"(default {DEFAULT_SAMPLE})")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per re-run (default: the sweep's budget.max_steps)")
    p.add_argument("--pruned", action="store_true",
                   help="also audit the trials ASHA stopped (reason 'pruned')")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help="largest quality gap to the best ok trial that counts as recovered "
                        f"(default {DEFAULT_MARGIN}: 10 %%)")
    p.add_argument("--trust-state", action="store_true",
                   help="audit a folder this account's sweeps did not write (it runs the "
                   "trainer the folder names)")
    p.set_defaults(func=cmd_audit)
