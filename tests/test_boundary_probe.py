"""``sweeps stability --probe``: the bracket/bisection logic on a pure "holds" function, and
the probe on the linreg trainer checked against an independent scan of ``sweeps try`` runs."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from sweeps.results import boundary
from sweeps.results.boundary import SeedRun, grid_points, probe
from tests.conftest import edit_linreg, run_cli_in

STEPS = 100


def edge_run(edges: dict[int, float], calls: list[tuple[float, int]] | None = None):
    """A run that holds iff value < the seed's edge; a failure stops at step 7."""

    def run(value: float, seed: int) -> SeedRun:
        if calls is not None:
            calls.append((value, seed))
        if value < edges[seed]:
            return SeedRun(True, STEPS)
        return SeedRun(False, 7, "divergence", 7)

    return run


@pytest.mark.parametrize("edge", [1e-3, 0.05, 0.3, 0.99, 1.0, 7.0])
@pytest.mark.parametrize("start", [1e-4, 0.02, 1.0, 50.0])
def test_interval_contains_the_edge_and_is_tight(edge, start):
    b = probe(edge_run({0: edge}), start, 1e-5, 100.0, seeds=[0], steps_per_run=STEPS)
    assert b.low < edge <= b.high
    assert b.high / b.low <= 1.25 + 1e-12
    assert b.steps == sum(p.steps for p in b.points)
    # one point per x4 from the start to the edge, then log2(ln 4 / ln 1.25) = 2.6 halvings
    bracket = math.ceil(abs(math.log(edge / start)) / math.log(boundary.FACTOR)) + 2
    assert len(b.points) <= bracket + 3


@pytest.mark.parametrize("edge", [0.05, 1.0, 7.0])
@pytest.mark.parametrize("off", [0.9, 0.99, 1.0, 1.1, 3.0, 0.1])
def test_a_predicted_start_takes_a_first_step_of_the_ratio(edge, off):
    """Seeded at ``off``× the edge: within 1.25 of it the answer takes two points; further
    off it still brackets and bisects to an interval that holds the edge."""
    b = probe(edge_run({0: edge}), edge * off, 1e-5, 100.0, seeds=[0], steps_per_run=STEPS,
              first=boundary.RATIO)
    assert b.low < edge <= b.high and b.high / b.low <= 1.25 + 1e-12
    if 1 / 1.25 <= off < 1.25:
        assert len(b.points) == 2
    plain = probe(edge_run({0: edge}), edge * off, 1e-5, 100.0, seeds=[0], steps_per_run=STEPS)
    assert len(b.points) <= len(plain.points) + 1


def test_seeds_are_added_only_where_needed_and_a_late_seed_failure_moves_the_answer():
    calls: list[tuple[float, int]] = []
    edges = {0: 1.0, 1: 0.8, 2: 0.9}  # the point holds iff every seed holds: below 0.8
    b = probe(edge_run(edges, calls), 0.01, 1e-5, 100.0, seeds=[0, 1, 2], steps_per_run=STEPS)
    assert b.low < 0.8 <= b.high and b.high / b.low <= 1.25 + 1e-12
    low = next(p for p in b.points if p.value == b.low)
    assert low.seeds == [0, 1, 2] and low.held
    for p in b.points:
        if not p.held:  # a point that failed is failed: no more seeds after the failure
            assert p.runs[-1].held is False and all(r.held for r in p.runs[:-1])
        elif p.value < b.low:  # below the answer one seed is enough
            assert p.seeds == [0]
    assert len(calls) == len(set(calls))  # no (value, seed) run twice


def test_boundary_outside_the_range_is_said():
    up = probe(edge_run({0: 1e9}), 1.0, 0.1, 10.0, seeds=[0], steps_per_run=STEPS)
    assert (up.low, up.high) == (10.0, None)
    assert "raise --range HIGH" in boundary.summary(up)[0]
    # no edge seen: no LR a margin below it (such a value was never run)
    assert up.advice()["lr"] is None
    assert any(line.startswith("advice: none for lr: nothing up to 10 failed")
               for line in boundary.summary(up))
    down = probe(edge_run({0: 1e-9}), 1.0, 0.1, 10.0, seeds=[0], steps_per_run=STEPS)
    assert (down.low, down.high) == (None, 0.1)
    assert "lower --range LOW" in boundary.summary(down)[0]


def test_grid_cost():
    assert grid_points(1.0, 1.25) == 2
    assert grid_points(0.4, 1.6) == 8  # 1.25**6.2 = 4
    assert boundary.grid_steps(0.4, 1.6, 3, 60) == 8 * 3 * 60


def held_by_try(folder, lr: float, seed: int) -> bool:
    """``sweeps try linreg.yaml --set lr=LR --seed SEED``: no rule fired, or only a slow one."""
    import os

    from sweeps.results.stability import SLOW_REASONS
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.tryout import try_trial

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        sweep = load_sweep("linreg.yaml", workdir=folder)
        reporter = try_trial(sweep, {"lr": lr}, seed=seed, console=Console(file=io.StringIO()))
    finally:
        os.chdir(cwd)
    return reporter.verdict is None or reporter.verdict.reason in SLOW_REASONS


def test_probe_on_linreg_brackets_the_edge_a_scan_of_tries_finds(linreg_dir, capsys):
    code = run_cli_in(linreg_dir, "stability", "linreg.yaml", "--param", "lr", "--probe",
                      "--seeds", "2", "--no-preflight", "--quiet", "--format", "json")
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"boundary_low", "boundary_high", "steps", "grid_steps", "probes"} <= set(out)
    low, high = out["boundary_low"], out["boundary_high"]
    assert high / low <= 1.25 + 1e-9
    assert out["steps"] < out["grid_steps"]
    assert out["probes"][0].keys() >= {"lr", "seeds", "outcome", "reason", "stop_step"}
    advice = out["advice"]  # a 2x margin below the held end; clip from the held runs' norms
    assert advice["lr"] == pytest.approx(low / 2) and advice["margin"] == 2
    assert advice["grad_clip"] > 0 and "pre-clip grad norms of the probe runs" in \
        advice["grad_clip_why"]
    # independent scan: every LR at or below the answer holds on both probe seeds and every
    # LR at or above its failing end fails on one of them (the edge lies inside)
    for lr in (low / 1.5, low / 1.1, low):
        assert all(held_by_try(linreg_dir, lr, s) for s in (0, 1)), lr
    for lr in (high, high * 1.1, high * 1.5):
        assert not all(held_by_try(linreg_dir, lr, s) for s in (0, 1)), lr
    text = (linreg_dir / "results" / "linreg" / "stability" / "boundary.md").read_text()
    assert f"{low:.4g}" in text and f"{high:.4g}" in text


@pytest.mark.parametrize(("argv", "flag"), [
    (("--param", "lr", "--probe", "--values", "0.1,1"), "--values"),
    (("--param", "lr", "--probe", "--and", "nope=0,1"), "--and"),
    (("--param", "lr", "--probe", "--and", "lr=0.1,1"), "--and"),
    (("--param", "lr", "--probe", "--and", "wd"), "--and"),
    (("--param", "wd", "--probe"), "--range"),
    (("--param", "lr", "--probe", "--range", "1:0.1"), "--range"),
    (("--param", "lr", "--values", "0.1,1", "--verify"), "--verify"),
    (("--param", "lr", "--values", "0.1,1", "--no-sharpness"), "--no-sharpness"),
    (("--param", "lr", "--probe", "--set", "nope=1"), "--set nope"),
    (("--param", "lr", "--values", "0.1,1", "--set", "lr=0.1"), "--set lr"),
    (("--param", "lr", "--probe", "--and", "wd=0,0.05", "--set", "wd=0"), "--set wd"),
])
def test_bad_probe_input_is_one_clear_error(linreg_dir, capsys, argv, flag):
    edit_linreg(linreg_dir, search_space={"wd": {"type": "uniform", "low": 0.0, "high": 0.1}},
                write_back={"wd": "train.wd"}, train={"wd": 0.0})
    assert run_cli_in(linreg_dir, "stability", "linreg.yaml", "--no-preflight", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and flag in err and "fix:" in err
    assert not (linreg_dir / "results" / "linreg" / "stability" / "boundary.md").exists()


def test_a_crossed_probe_finds_one_boundary_per_value_of_the_second_knob(linreg_dir, capsys):
    """``--probe --and wd=0,0.05``: the LR boundary probed at each wd (a knob linreg's
    trainer ignores, so both answers are the plain probe's), one JSON row and one section
    of boundary.md each, and a summary line per value."""
    edit_linreg(linreg_dir, search_space={"wd": {"type": "uniform", "low": 0.0, "high": 0.1}},
                write_back={"wd": "train.wd"}, train={"wd": 0.0})
    base = ("stability", "linreg.yaml", "--param", "lr", "--probe", "--seeds", "1",
            "--no-preflight", "--quiet", "--format", "json")
    assert run_cli_in(linreg_dir, *base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert run_cli_in(linreg_dir, *base, "--and", "wd=0,0.05") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["param"] == "lr" and out["crossed"] == "wd"
    assert [r["wd"] for r in out["rows"]] == [0.0, 0.05]
    for row in out["rows"]:
        assert (row["boundary_low"], row["boundary_high"]) == \
            (plain["boundary_low"], plain["boundary_high"])
    text = (linreg_dir / "results" / "linreg" / "stability" / "boundary.md").read_text()
    assert "## wd = 0.0" in text and "## wd = 0.05" in text
    assert run_cli_in(linreg_dir, *base[:-2], "--and", "wd=0,0.05") == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:1] == ["0.05"] and f"{plain['boundary_low']:.4g}" in line
               for line in lines)


def test_set_holds_a_knob_at_its_value_in_every_probe_run(linreg_dir, capsys):
    """``--set crash_above=1e-4`` (a knob of linreg's trainer that raises above that LR):
    every probe run crashes, where the base config's own value (50) lets them train; so
    the held value is the one the trainer got."""
    edit_linreg(linreg_dir, search_space={
        "crash_above": {"type": "uniform", "low": 1.0e-6, "high": 100.0}},
        write_back={"crash_above": "train.crash_above"}, train={"crash_above": 50.0})
    base = ("stability", "linreg.yaml", "--param", "lr", "--probe", "--seeds", "1",
            "--no-preflight", "--quiet", "--no-sharpness")
    assert run_cli_in(linreg_dir, *base, "--set", "crash_above=1e-4") == 1
    assert "crash" in capsys.readouterr().err
    assert run_cli_in(linreg_dir, *base) == 0


def test_a_probe_around_a_hand_over_starts_at_its_lr_and_says_what_it_held(linreg_dir,
                                                                          capsys):
    """A hand-over's ``# knobs:`` line copied whole into ``--set`` holds its lr too: the
    probe starts its bracket there (the grid still refuses it), and boundary.md opens with
    the values every run had, so it reads apart from a probe around the base config."""
    edit_linreg(linreg_dir, search_space={"wd": {"type": "uniform", "low": 0.0, "high": 0.1}},
                write_back={"wd": "train.wd"}, train={"wd": 0.0})
    base = ("stability", "linreg.yaml", "--param", "lr", "--probe", "--seeds", "1",
            "--no-preflight", "--no-sharpness")
    assert run_cli_in(linreg_dir, *base, "--set", "lr=0.0123", "--set", "wd=0.05") == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("probe lr=0.0123 seed 0:")
    text = (linreg_dir / "results" / "linreg" / "stability" / "boundary.md").read_text()
    assert "Every run: wd=0.05 (--set wd, the rest the base config's); the bracket started " \
        "at lr=0.0123 (--set)" in text
    assert run_cli_in(linreg_dir, *base) == 0
    text = (linreg_dir / "results" / "linreg" / "stability" / "boundary.md").read_text()
    assert "Every run: wd=0 (the base config's); the bracket started at lr=0.1 (the base " \
        "config's)" in text
