"""The CLI, the rules, the spec loader and the results code import neither torch nor Ray.

Each check runs in a fresh interpreter: this test process has imported both already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray")


def _heavy_after(code: str) -> list[str]:
    """The heavy modules loaded once ``code`` has run in a new interpreter."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_light_modules_import_neither_torch_nor_ray():
    assert _heavy_after("import sweeps, sweeps.commands.cli, sweeps.rules, sweeps.spec.loader, "
                        "sweeps.results.files, sweeps.protocol") == []


def test_the_trial_book_and_what_reads_it_import_no_ray():
    """The record of trials and the selection and audit built on it run without Ray: Ray
    Tune's hooks into the book live in sweeps.tune.callbacks."""
    assert "ray" not in _heavy_after("import sweeps.record.book, sweeps.results.audit, "
                                     "sweeps.record.worker_logs")


def test_help_imports_neither_torch_nor_ray():
    code = ("import contextlib, io\nfrom sweeps.commands.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])")
    assert _heavy_after(code) == []


def test_public_names_still_import_from_the_package():
    import torch

    import sweeps
    from sweeps import COMPILE_MODES, REASONS, Monitor, Verdict, compile_model
    from sweeps.trial.monitor import Monitor as monitor_class

    assert Monitor is monitor_class
    model = torch.nn.Linear(2, 1)
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    assert "grad_norm" in Monitor(model).measure(loss)
    assert compile_model(model, "none") is model
    assert "none" in COMPILE_MODES and REASONS and Verdict.__name__ == "Verdict"
    assert set(sweeps.__all__) <= set(dir(sweeps))
    with pytest.raises(AttributeError, match="no attribute 'Monitr'"):
        sweeps.Monitr  # noqa: B018


def test_monitor_loads_torch_on_first_use():
    assert _heavy_after("from sweeps import Monitor") == ["torch"]


def test_ray_is_imported_only_in_the_tune_package_and_the_cluster_commands():
    """Ray Tune runs, the searcher, schedulers and callbacks live in sweeps/tune/; the
    cluster commands use Ray's Jobs client. Nothing else names Ray, even lazily."""
    import ast

    allowed = ("sweeps/tune/", "sweeps/cluster/")
    found = []
    for path in sorted((ROOT / "sweeps").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "ray" or n.startswith("ray.") for n in names) and \
                    not rel.startswith(allowed):
                found.append(f"{rel}:{node.lineno}")
    assert found == []
