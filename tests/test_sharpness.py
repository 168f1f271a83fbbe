"""The sharpness estimate that seeds ``sweeps stability --probe`` (``loss_closure``), and
``--verify``: power iteration against exact Hessians, the predicted boundaries against
real optimizer runs, and the probe end to end on the quadratic of ``bench/quadratic.py``."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from sweeps.results.sharpness import estimate, from_hook, top_eigenvalue
from tests.conftest import run_cli_in, write_sweep

QUADRATIC = Path(__file__).resolve().parents[1] / "bench" / "quadratic.py"


def quadratic_module():
    spec = importlib.util.spec_from_file_location("bench_quadratic", QUADRATIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quad_config(lam: float, dim: int = 8, spread: float = 100.0, seed: int = 0) -> dict:
    return {"quad": {"lr": 0.01, "lam": lam, "dim": dim, "spread": spread},
            "sweep": {"seed": seed, "max_steps": 300}}


# -- the estimate -------------------------------------------------------------------------

@pytest.mark.parametrize(("lam", "dim", "spread"), [(0.5, 8, 100.0), (2.0, 8, 100.0),
                                                    (100.0, 8, 100.0), (3.0, 64, 1.5)])
def test_top_eigenvalue_on_the_quadratic_is_within_one_percent(lam, dim, spread):
    est = from_hook(quadratic_module().loss_closure(quad_config(lam, dim, spread)))
    assert est.optimizer == "GD" and est.formula == "2/λ_max"
    assert abs(est.lam - lam) <= 0.01 * lam
    assert abs(est.predicted - 2 / lam) <= 0.01 * 2 / lam
    assert est.iterations <= 20


def test_top_eigenvalue_matches_the_exact_hessian_of_a_small_network():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    params = list(net.parameters())
    shapes = [p.shape for p in params]

    def loss_of(flat: torch.Tensor) -> torch.Tensor:
        chunks, i = [], 0
        for s in shapes:
            n = math.prod(s)
            chunks.append(flat[i:i + n].view(s))
            i += n
        w1, b1, w2, b2 = chunks
        return ((torch.tanh(x @ w1.T + b1) @ w2.T + b2 - y) ** 2).mean()

    flat = torch.cat([p.detach().flatten() for p in params])
    exact = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss_of, flat))
    rng_before = torch.get_rng_state()
    est = estimate(params, lambda: ((net(x) - y) ** 2).mean(), iters=100)
    assert abs(est.lam - float(exact[-1])) <= 0.01 * float(exact[-1])
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG is untouched


def test_a_saddle_gives_the_largest_positive_curvature():
    h = torch.tensor([-10.0, 1.0, 3.0], dtype=torch.float64)
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    est = estimate([x], lambda: 0.5 * (h * x * x).sum(), iters=200)
    assert abs(est.lam - 3.0) <= 0.03


def _gd_grows(make_opt, lam: float, lr: float, steps: int = 400) -> bool:
    """Runs ``make_opt`` on 0.5·λ·x² at ``lr``: whether |x| ends above where it started."""
    x = torch.ones(1, dtype=torch.float64, requires_grad=True)
    opt = make_opt([x], lr)
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * lam * x * x).sum().backward()
        opt.step()
    return float(x.detach().abs()) > 1.0


@pytest.mark.parametrize(("make", "numerator"), [
    (lambda p, lr: torch.optim.SGD(p, lr=lr), 2.0),
    (lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9), 3.8),
    (lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True), 3.8 / 2.8),
])
def test_the_sgd_prediction_is_where_the_optimizer_starts_to_diverge(make, numerator):
    lam = 5.0
    x = torch.ones(1, dtype=torch.float64, requires_grad=True)
    est = estimate([x], lambda: (0.5 * lam * x * x).sum(), make([x], 0.01))
    assert est.predicted == pytest.approx(numerator / lam, rel=1e-6)
    assert not _gd_grows(make, lam, 0.97 * est.predicted)
    assert _gd_grows(make, lam, 1.03 * est.predicted)


def test_adam_uses_the_preconditioned_sharpness():
    lams = torch.tensor([0.1, 1.0, 30.0], dtype=torch.float64)
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([x], lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    est = estimate([x], lambda: 0.5 * (lams * x * x).sum(), opt, adam_steps=5, iters=50)
    state = opt.state[x]
    p = (state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))).sqrt() + 1e-8
    exact = float((lams / p).max())  # P^-1 H is diagonal here
    assert float(state["step"]) == 5
    assert est.optimizer == "Adam" and abs(est.lam - exact) <= 0.01 * exact
    assert est.predicted == pytest.approx(38 / est.lam, rel=1e-9)


def test_what_the_estimate_cannot_use_is_a_value_error():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="not RMSprop"):
        estimate([x], lambda: (x * x).sum(), torch.optim.RMSprop([x]))
    with pytest.raises(ValueError, match="not a scalar tensor"):
        estimate([x], lambda: x * x)
    with pytest.raises(ValueError, match="no curvature"):
        estimate([x], lambda: x.sum())
    with pytest.raises(ValueError, match="not \\(params, closure\\)"):
        from_hook(lambda: x.sum())


def test_top_eigenvalue_stops_once_it_settles():
    scale = torch.tensor([4.0, 1.0], dtype=torch.float64)
    lam, used = top_eigenvalue(lambda v: [scale * v[0]], [scale], iters=50)
    assert lam == pytest.approx(4.0, rel=1e-6) and used < 50


# -- the probe on the quadratic, through the command ------------------------------------------

def quad_folder(folder: Path, lam: float = 2.0, *, closure: str = "yes",
                steps: int = 300) -> Path:
    """A sweep of the quadratic (λ_max = ``lam``, base lr 0.01) in ``folder``; ``closure``
    "yes" (bench/quadratic.py as it is), "no" (a trainer module without the hook) or
    "raises" (a hook that raises)."""
    shutil.copy(QUADRATIC, folder / "quadratic.py")
    (folder / "quad_plain.py").write_text("from quadratic import train  # noqa: F401\n")
    (folder / "quad_broken.py").write_text(
        "from quadratic import train  # noqa: F401\n\n\n"
        "def loss_closure(config):\n    raise RuntimeError('no batch here')\n")
    module = {"yes": "quadratic", "no": "quad_plain", "raises": "quad_broken"}[closure]
    write_sweep(folder, {
        "name": "quad", "trainer": f"{module}:train",
        "base_config": {"quad": {"lr": 0.01, "lam": lam, "dim": 8, "spread": 100.0}},
        "search_space": {"lr": {"type": "loguniform", "low": 1e-6, "high": 1e3}},
        "write_back": {"lr": "quad.lr"},
        "objectives": [{"metric": "loss", "mode": "min"}],
        "budget": {"trials": 1, "max_steps": steps, "concurrent": 1, "scheduler": "none"},
        "resources": {"cpu": 1, "gpu": 0}, "seed": 0})
    return folder


def probe_json(folder: Path, capsys, *extra: str, err: list[str] | None = None) -> dict:
    code = run_cli_in(folder, "stability", "sweep.yaml", "--param", "lr", "--probe",
                      "--seeds", "2", "--no-preflight", "--quiet", "--format", "json", *extra)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    if err is not None:
        err.append(captured.err)
    return json.loads(captured.out)


def contains(out: dict, edge: float) -> bool:
    return out["boundary_low"] <= edge * (1 + 1e-9) and edge < out["boundary_high"]


@pytest.mark.parametrize("lam", [0.5, 10.0])
def test_the_prediction_seeds_the_probe_which_spends_fewer_steps(tmp_path, capsys, lam):
    folder = quad_folder(tmp_path, lam)
    seeded = probe_json(folder, capsys)
    unseeded = probe_json(folder, capsys, "--no-sharpness")
    edge = 2 / lam
    assert seeded["predicted"] == pytest.approx(edge, rel=0.01)
    assert seeded["sharpness"]["lambda_max"] == pytest.approx(lam, rel=0.01)
    assert seeded["probes"][0]["lr"] == pytest.approx(seeded["predicted"])  # started there
    assert contains(seeded, edge) and contains(unseeded, edge)
    assert seeded["width"] <= 1.25 + 1e-9
    assert seeded["steps"] < unseeded["steps"]
    assert unseeded["predicted"] is None and unseeded["sharpness"] is None
    assert any(p["lr"] == pytest.approx(0.01) for p in unseeded["probes"])  # the base lr


def test_the_prediction_is_in_the_text_and_boundary_md(tmp_path, capsys):
    folder = quad_folder(tmp_path, 2.0)
    assert run_cli_in(folder, "stability", "sweep.yaml", "--param", "lr", "--probe",
                      "--seeds", "2", "--no-preflight", "--quiet") == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("predicted:"))
    assert "lr 1 = 2/λ_max" in line and "the interval holds it" in line
    md = (folder / "results" / "quad" / "stability" / "boundary.md").read_text()
    assert line in md


def test_without_the_closure_nothing_changes(tmp_path, capsys):
    folder = quad_folder(tmp_path, 2.0, closure="no")
    out = probe_json(folder, capsys)
    assert out["predicted"] is None and out["sharpness_note"] is None
    assert out["probes"][0]["lr"] == pytest.approx(0.01)  # the bracket from the base lr
    assert contains(out, 1.0)


def test_a_hook_that_raises_is_said_and_the_probe_goes_on(tmp_path, capsys):
    folder = quad_folder(tmp_path, 2.0, closure="raises")
    out = probe_json(folder, capsys)
    assert out["predicted"] is None
    assert "loss_closure failed (RuntimeError: no batch here)" in out["sharpness_note"]
    assert contains(out, 1.0)


# -- --verify ---------------------------------------------------------------------------------

def test_verify_agrees_on_the_quadratic(tmp_path, capsys):
    folder = quad_folder(tmp_path, 2.0)
    out = probe_json(folder, capsys, "--verify", "--seeds", "3")
    v = out["verify"]
    assert v["agrees"] is True and v["disagrees"] is None and v["steps_per_run"] == 300
    assert v["low"]["lr"] == out["boundary_low"] and v["low"]["seeds"] == [0, 1, 2]
    assert v["low"]["outcome"] == "held" and v["low"]["steps"] == 3 * 300
    assert v["high"]["lr"] == out["boundary_high"] and v["high"]["outcome"] == "failed"
    assert v["high"]["seeds"] == [0]  # one failing seed settles the failed end
    assert run_cli_in(folder, "stability", "sweep.yaml", "--param", "lr", "--probe",
                      "--seeds", "2", "--no-preflight", "--quiet", "--verify") == 0
    text = capsys.readouterr().out
    assert "\nagrees: " in text and "disagrees" not in text
    md = (folder / "results" / "quad" / "stability" / "boundary.md").read_text()
    assert "verify: full 300-step runs on seed(s) 0, 1" in md


def test_verify_disagrees_when_the_probe_runs_were_too_short(tmp_path, capsys):
    """Probed with 12-step runs the quadratic's slow divergence just above 2/λ_max (lr 1.039:
    |1 - lr·λ| = 1.08 a step) has no time to show; the full 300-step runs at the held end
    do see it."""
    folder = quad_folder(tmp_path, 2.0)
    short = ("--steps", "12", "--range", "0.9:1.2", "--no-sharpness", "--verify")
    err: list[str] = []
    out = probe_json(folder, capsys, *short, err=err)
    assert err[0].startswith("disagrees: ")  # said beside the JSON, which stays JSON
    assert out["steps_per_run"] == 12 and out["boundary_low"] > 1.0  # past the true edge
    v = out["verify"]
    assert v["agrees"] is False and v["steps_per_run"] == 300
    assert v["low"]["outcome"] == "failed" and "--steps 300" in v["disagrees"]
    assert run_cli_in(folder, "stability", "sweep.yaml", "--param", "lr", "--probe",
                      "--seeds", "2", "--no-preflight", "--quiet", *short) == 0  # not an error
    lines = capsys.readouterr().out.splitlines()
    said = [x for x in lines if x.startswith("disagrees: ")]
    assert len(said) == 1 and "the boundary lies lower than the interval" in said[0]
