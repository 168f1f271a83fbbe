"""Start-up: what a command costs before any trial runs, against a plain Ray Tune script.

Each command runs in a fresh interpreter, ``--repeats`` times; the table gives the
median wall time and its ratio to what a plain Ray Tune + OptunaSearch script pays
just to import its libraries (``import ray.tune, optuna`` plus the Optuna searcher):

- ``python -c pass``: the interpreter alone;
- ``plain tune import``: ``from ray import tune; from ray.tune.search.optuna import
  OptunaSearch`` (the alternative's floor);
- ``sweeps --help``: the CLI's help (no torch, no Ray: lazy imports);
- ``import sweeps.rules`` / ``sweeps.spec.loader`` / ``sweeps.record.book``: the pure modules;
- ``import torch``: what importing a PyTorch trainer costs at least;
- ``sweeps validate FILE``: load and check a sweep file, importing its trainer
  (torch, through the trainer), without Ray.

Targets (issue #15): ``sweeps --help`` ≤ 0.5 s, ``sweeps validate examples/direction.yaml``
≤ 2 s on a 2-core machine.

    python bench/startup.py
    python bench/startup.py --repeats 3 --sweep path/to/your.yaml
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, machine, save, table  # noqa: E402

PY = sys.executable


def commands(sweep: Path) -> dict[str, list[str]]:
    sweeps = [PY, "-m", "sweeps"]
    return {
        "python -c pass": [PY, "-c", "pass"],
        "plain tune import": [PY, "-c", "from ray import tune; "
                              "from ray.tune.search.optuna import OptunaSearch"],
        "sweeps --help": [*sweeps, "--help"],
        "import sweeps.rules": [PY, "-c", "import sweeps.rules"],
        "import sweeps.spec.loader": [PY, "-c", "import sweeps.spec.loader"],
        "import sweeps.record.book": [PY, "-c", "import sweeps.record.book"],
        "import torch": [PY, "-c", "import torch"],
        f"sweeps validate {sweep.name}": [*sweeps, "validate", str(sweep)],
    }


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sweep", type=Path, default=ROOT / "examples" / "direction.yaml")
    args = ap.parse_args()
    cmds = commands(args.sweep.resolve())
    for cmd in cmds.values():  # warm the file cache: the first run reads every .pyc
        timed(cmd, ROOT)
    walls = {name: [timed(cmd, ROOT) for _ in range(args.repeats)] for name, cmd in cmds.items()}
    plain = statistics.median(walls["plain tune import"])
    rows = [{"command": name, "median s": statistics.median(w), "min s": min(w),
             "max s": max(w), "÷ plain tune import": statistics.median(w) / plain}
            for name, w in walls.items()]
    print(table(rows, floatfmt=".2f"))
    save("startup", {"machine": machine(), "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
