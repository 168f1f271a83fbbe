"""`sweeps stability` on a trainer whose divergence boundary is known.

Plain SGD on standardised linear regression: the minibatch loss Hessian's
largest eigenvalue is ~2.6 at most, so LR ≤ 0.5 is stable, LR ≥ 0.9 spikes
or blows up, LR 1e-5 does not learn within the budget. A variant with fresh
label noise at every step (NOISY_TRAINER) is stable up to the same LRs, but its
clean validation loss gets clearly worse with the LR long before that.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from sweeps.commands.cli import main
from sweeps.record.book import TrialRecord
from sweeps.results import stability
from tests.conftest import edit_linreg

NOISY_TRAINER = '''"""linreg_trainer's data with label noise drawn afresh at every step: the
weights jitter around the optimum by an amount that grows with the LR, so the
clean validation loss gets worse with the LR well before the LR gets unstable."""

import torch

from sweeps import Monitor

NOISE = 0.5  # label noise std; the signal's is 1: the baseline loss is 1 + NOISE**2


def train(config, report):
    lr, run = float(config["train"]["lr"]), config.get("sweep", {})
    torch.manual_seed(int(run.get("seed", 0)))
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(512, 8, generator=gen)
    w = torch.randn(8, 1, generator=gen)
    y = x @ (w / w.norm())
    model = torch.nn.Linear(8, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    monitor = Monitor(model, opt)
    steps = int(run.get("max_steps", config["train"]["steps"]))
    for step in range(1, steps + 1):
        idx = torch.randint(0, 384, (16,))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx] + NOISE * torch.randn(16, 1))
        opt.zero_grad()
        loss.backward()
        metrics = monitor.measure(loss)
        opt.step()
        metrics["step"] = step
        if step % 10 == 0 or step == steps:
            with torch.no_grad():
                val = torch.nn.functional.mse_loss(model(x[384:]), y[384:])
            metrics["val_loss"] = float(val)
        report(metrics)
'''


@pytest.mark.slow
def test_lr_grid_places_the_boundary_and_recommends_below_it(linreg_dir, ray_session,
                                                            capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    code = main(["stability", "linreg.yaml", "--param", "lr", "--values",
                 "1e-5,0.01,0.1,0.5,2,5", "--seeds", "2", "--quiet", "--no-preflight"])
    assert code == 0
    out = capsys.readouterr().out
    table = pd.read_csv(linreg_dir / "results" / "linreg" / "stability" / "stability.csv")
    verdicts = dict(zip(table["lr"], table["verdict"], strict=True))
    assert verdicts[1e-5] == "too slow"
    # 0.01 is stable but has not converged in 60 steps: ~50x the best val_loss
    assert verdicts[0.01] == "stable, poor" and verdicts[0.1] == "stable"
    assert verdicts[0.5].startswith("stable")
    assert verdicts[2.0] == verdicts[5.0] == "explodes"
    rows = table.set_index("lr")
    assert rows.loc[5.0, "stable_seeds"] == "0/2"
    assert {"val_loss", "val_loss_min", "val_loss_max", "quality_gap"} <= set(table.columns)
    # 0.01 gives up ~12 % of the best cell's improvement over the random-guess loss 1.0
    assert rows.loc[0.1, "quality_gap"] == 0 and rows.loc[0.01, "quality_gap"] > 0.1
    assert rows.loc[0.01, "val_loss_min"] <= rows.loc[0.01, "val_loss"] <= \
        rows.loc[0.01, "val_loss_max"]
    assert rows.loc[[1e-5, 2.0, 5.0], "val_loss"].isna().all(), "no quality without stable seeds"
    assert "boundary: between 0.5 and 2 (explodes)" in out
    assert "recommended lr: 0.1" in out and "also the largest safe value" in out
    md = (linreg_dir / "results" / "linreg" / "stability" / "stability.md").read_text()
    assert "between 0.5 and 2 (explodes)" in md and "recommended grad_clip" in md
    assert "Every run: 60 steps, 2 seed(s) per cell; no other knob searched." in md
    assert "val_loss (min–max)" in md and "'stable, poor' = more than 10% worse" in md


@pytest.mark.slow
def test_recommends_the_best_quality_safe_value_not_the_largest(linreg_dir, ray_session,
                                                                capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    (linreg_dir / "noisy_trainer.py").write_text(NOISY_TRAINER)
    # no random-guess loss given: quality gaps are relative to the best cell's value
    edit_linreg(linreg_dir, trainer="noisy_trainer:train", rules={"baseline_loss": None})
    assert main(["stability", "linreg.yaml", "--param", "lr", "--values", "0.03,0.1,0.3,3",
                 "--seeds", "2", "--steps", "150", "--quiet", "--no-preflight"]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(linreg_dir / "results" / "linreg" / "stability" / "stability.csv")
    table = table.set_index("lr")
    assert list(table["verdict"]) == ["stable", "stable, poor", "stable, poor", "explodes"]
    # the safe zone (<= 0.3 / 2) holds 0.03 and 0.1; 0.1 is stable but several times worse
    assert table.loc[0.1, "val_loss"] > 2 * table.loc[0.03, "val_loss"]
    assert "boundary: between 0.3 and 3 (explodes)" in out
    assert "recommended lr: 0.03 (" in out
    assert "the largest safe value 0.1 is" in out and "% worse" in out


def test_clip_warning_names_the_cause():
    def run(lr: float, clip: float, norms: list[float], reason: str | None = None
            ) -> stability.Cell:
        history = [{"step": k, "grad_norm": n} for k, n in enumerate(norms, 1)]
        rec = TrialRecord(trial_id=f"{lr}", values={"lr": lr, "grad_clip": clip}, seed=0,
                          status="unstable" if reason else "ok", reason=reason, history=history)
        return stability.Cell((lr,), [rec])

    flat = run(1e-4, 1.0, [2.9, 3.0, 2.8, 2.9, 2.7] + [2.6] * 20)  # starts above the clip
    grows = run(0.3, 1.0, [0.5] * 5 + [0.8] * 5 + [4.0] * 15)      # the LR makes it grow
    settles = run(1e-2, 1.0, [0.9] * 5 + [1.2] * 20)               # rises past it, no growth
    quiet = run(1e-3, 5.0, [2.9] * 25)                             # never clipped
    blown = run(3.0, 1.0, [2.0, 40.0, 900.0, 2e4], "grad_blowup")  # blew up in 4 steps
    flat_msg, grows_msg, settles_msg, blown_msg = stability.clip_warnings(
        [flat, grows, settles, quiet, blown])
    assert "grad_clip 1 is below the typical grad norm at start (~2.9)" in flat_msg
    assert "every step is clipped, so the clip acts as a normalisation" in flat_msg
    assert "raise grad_clip to ≈2.9 or more" in flat_msg and "the LR" not in flat_msg
    assert "grew from ~0.5 at the start to ~4" in grows_msg and "the LR, not" in grows_msg
    assert "settles above grad_clip 1" in settles_msg
    assert "from ~2 at the start to a peak of 2e+04 and grad_blowup stopped the run" in blown_msg
    assert "the LR, not grad_clip 1" in blown_msg


def test_recommendation_follows_the_objective_mode():
    def cell(v: float, accuracy: float) -> stability.Cell:
        history = [{"step": k, "loss": 1.0 / k, "acc": accuracy} for k in range(1, 20)]
        return stability.Cell((v,), [TrialRecord(trial_id=f"{v}", values={"lr": v}, seed=0,
                                                 status="ok", history=history)])

    rows = [cell(1e-3, 0.90), cell(1e-2, 0.80), cell(3e-2, 0.95),
            stability.Cell((1.0,), [TrialRecord(trial_id="x", values={"lr": 1.0}, seed=0,
                                                status="unstable", reason="grad_blowup")])]
    value, why = stability.recommend(rows, stability.Quality("acc", "max"))
    assert value == 1e-3  # 3e-2 is best but within 2x of the boundary; 1e-2 is the largest safe
    assert "the largest safe value 0.01 is 11% worse (0.8)" in why
    assert stability.recommend(rows, stability.Quality("acc", "min"))[0] == 1e-2
    assert stability.recommend(rows)[0] == 1e-2, "no quality: the largest safe value"
    marks = stability.verdicts(rows, stability.Quality("acc", "max"))
    assert marks[(1e-3,)] == "stable" and marks[(1e-2,)] == "stable, poor"


@pytest.mark.slow
def test_two_knob_map_and_clip_warning(linreg_dir, ray_session, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    data = yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    data["search_space"]["grad_clip"] = {"type": "uniform", "low": 0.0, "high": 10.0}
    data["write_back"]["grad_clip"] = "train.grad_clip"
    data["new_keys"] = True  # the base config has no grad_clip
    (linreg_dir / "linreg.yaml").write_text(yaml.safe_dump(data))
    assert main(["stability", "linreg.yaml", "--param", "lr", "--values", "0.01,5",
                 "--and", "grad_clip=0.01,10", "--seeds", "1", "--quiet",
                 "--no-preflight"]) == 0
    out = linreg_dir / "results" / "linreg" / "stability"
    assert (out / "stability_map.png").stat().st_size > 1000
    table = pd.read_csv(out / "stability.csv")
    assert len(table) == 4 and set(table.columns) >= {"lr", "grad_clip", "val_loss", "verdict"}
    # the trainer ignores grad_clip, so every norm above the clip counts as clipped
    warnings = {line.split(" (seed")[0]: line for line in capsys.readouterr().out.splitlines()
                if line.startswith("warning: ")}
    # at lr 0.01 the norm starts at ~1.8 and shrinks: the clip, not the LR, is the cause
    slow = warnings["warning: 0.01 × 0.01"]
    assert "grad_clip 0.01 is below the typical grad norm at start" in slow
    assert "raise grad_clip" in slow and "the LR" not in slow
    # at lr 5 the norm grows until a rule stops the run: the LR is the cause
    assert "the LR, not grad_clip" in warnings["warning: 5 × 0.01"]
    # at lr 5 with grad_clip 10 the loss explodes on step 2, before clipping could matter
    big = table[(table["lr"] == 5) & (table["grad_clip"] == 10)].iloc[0]
    assert big["verdict"] == "explodes" and "divergence" in big["reasons"]
    assert "warning: 0.01 × 10" not in warnings


def test_boundary_logic_on_synthetic_cells():
    def cell(v, statuses, reason="grad_blowup"):
        runs = [TrialRecord(trial_id=f"{v}-{i}", values={"lr": v}, seed=i, status=s,
                            reason=None if s == "ok" else reason,
                            history=[{"step": k, "loss": 1.0 / k} for k in range(1, 20)])
                for i, s in enumerate(statuses)]
        return stability.Cell((v,), runs)

    rows = [cell(1e-4, ["ok", "ok"]), cell(1e-3, ["ok", "ok"]), cell(3e-3, ["ok", "unstable"]),
            cell(1e-2, ["unstable", "unstable"])]
    below, above = stability.boundary(rows)
    assert below.key == (1e-3,) and above.key == (3e-3,) and above.verdict() == "borderline"
    value, why = stability.recommend(rows)
    assert value == 1e-4 and "2x below" in why
    rows[0] = cell(1e-4, ["unstable", "unstable"], reason="flat_at_baseline")
    assert rows[0].verdict() == "too slow"
    assert rows[3].verdict() == "explodes"
    # outputs collapsed onto the mean image on both seeds: they failed, nothing exploded
    collapsed = cell(1e-2, ["unstable", "unstable"], reason="collapse")
    assert collapsed.verdict() == "fails"
    rows[3] = collapsed
    assert stability.boundary(rows)[1].key == (3e-3,), "a failing cell is past the edge too"


def test_a_trainer_that_raises_is_crashed_not_explodes():
    runs = [TrialRecord(trial_id=f"c{i}", values={"lr": 0.1}, seed=i, status="crash",
                        reason="crash", history=[]) for i in range(2)]
    crashed = stability.Cell((0.1,), runs)
    assert crashed.verdict() == "crashed"
    assert stability.boundary([crashed]) == (None, None), "a crash is no stability boundary"
    mixed = stability.Cell((0.1,), [runs[0], TrialRecord(
        trial_id="u", values={"lr": 0.1}, seed=2, status="unstable", reason="non_finite",
        history=[{"step": 1, "loss": 1.0}])])
    assert mixed.verdict() in ("explodes", "borderline")


@pytest.mark.slow
def test_stability_and_run_of_one_sweep_keep_their_own_files(linreg_dir, ray_session,
                                                             monkeypatch):
    monkeypatch.chdir(linreg_dir)
    edit_linreg(linreg_dir, budget={"trials": 2, "concurrent": 2}, confirm={"seeds": 0})
    assert main(["stability", "linreg.yaml", "--param", "lr", "--values", "0.05",
                 "--seeds", "1", "--quiet"]) == 0
    out = linreg_dir / "results" / "linreg"
    written = {p: p.read_bytes() for p in (out / "stability").rglob("*.*")
               if p.is_file() and p.suffix in (".csv", ".md", ".json")}
    assert out / "stability" / "stability.csv" in written
    assert out / "stability" / "preflight.md" in written
    assert main(["run", "linreg.yaml", "--quiet"]) == 0
    assert not list(linreg_dir.glob("results/linreg.*")), "stability results are not archived"
    assert (out / "trials.csv").is_file() and (out / "preflight.md").is_file()
    for path, data in written.items():
        assert path.read_bytes() == data, f"{path} was overwritten by the run"


@pytest.mark.slow
def test_a_grid_point_where_the_trainer_raises_exits_1_naming_it(linreg_dir, ray_session,
                                                                 monkeypatch, capsys):
    """One crashed cell is an error to fix: the files are written, and the exit is 1."""
    monkeypatch.chdir(linreg_dir)
    edit_linreg(linreg_dir, train={"crash_above": 1.0})
    assert main(["stability", "linreg.yaml", "--param", "lr", "--values", "0.05,5",
                 "--seeds", "1", "--quiet", "--no-preflight"]) == 1
    captured = capsys.readouterr()
    assert "the trainer crashed on every seed at lr=5" in captured.err
    table = pd.read_csv(linreg_dir / "results" / "linreg" / "stability" / "stability.csv")
    assert dict(zip(table["lr"], table["verdict"], strict=True)) == {0.05: "stable", 5.0: "crashed"}


@pytest.mark.parametrize(("argv", "says"), [
    (["--param", "lr", "--values", "1e-3,abc"], "--param lr: 'abc' is not a number"),
    (["--param", "lr", "--values", "1e-3", "--and", "lr=1e-2"],
     "--and: names lr, the knob --param already varies"),
])
def test_a_grid_value_the_trainer_could_not_take_is_bad_input(linreg_dir, capsys, monkeypatch,
                                                             argv, says):
    monkeypatch.chdir(linreg_dir)
    assert main(["stability", "linreg.yaml", "--no-preflight", "--seeds", "1", *argv]) == 2
    assert says in " ".join(capsys.readouterr().err.split())
    assert not (linreg_dir / "results").exists()


def test_a_cell_that_fell_to_the_random_guess_is_too_slow():
    """Started above ln 4 (1.78) and sat at 1.39 from step 21: its loss decreased, and it
    learnt nothing."""
    guess = math.log(4)
    history = [{"step": k, "loss": 1.78 if k < 21 else guess + 0.005} for k in range(1, 151)]
    run = TrialRecord(trial_id="r", values={"lr": 0.3}, seed=0, status="ok", history=history)
    assert stability.Cell((0.3,), [run]).verdict() == "stable", "without a baseline"
    cell = stability.Cell((0.3,), [run], guess=(guess, 0.05))
    assert cell.loss_decreased() and cell.verdict() == "too slow"
    learnt = [{"step": k, "loss": 1.78 if k < 21 else 0.6} for k in range(1, 151)]
    good = TrialRecord(trial_id="g", values={"lr": 0.01}, seed=0, status="ok", history=learnt)
    assert stability.Cell((0.01,), [good], guess=(guess, 0.05)).verdict() == "stable"


def test_grad_clip_is_advised_from_the_runs_at_the_recommended_value():
    """Grad norms shrink as the LR grows: a clip from runs at lr 1 (norms ~0.01) would clip
    every step at the recommended lr 1e-3 (norms ~5)."""
    def cell(v: float, norm: float) -> stability.Cell:
        history = [{"step": k, "loss": 1.0 / k, "grad_norm": norm * (1 + k % 3 / 10)}
                   for k in range(1, 41)]
        return stability.Cell((v,), [TrialRecord(trial_id=f"{v}", values={"lr": v}, seed=0,
                                                 status="ok", history=history)])

    rows = [cell(1e-3, 5.0), cell(1.0, 0.01)]
    clip, why = stability.recommend_clip(rows, 1e-3)
    assert 10 <= clip <= 25 and "stable runs at 0.001" in why
    pooled, _ = stability.recommend_clip(rows)
    assert pooled < clip, "every run pooled: the small norms pull the clip down"


def test_a_grid_over_grad_clip_recommends_a_clip_it_tested():
    """``--and grad_clip=0,0.5,5``: the clip is the best stable cell's at the recommended
    LR, not a percentile of grad norms that no cell ran (0.04, below the space)."""
    def cell(lr: float, clip: float, quality: float) -> stability.Cell:
        history = [{"step": k, "loss": 1.0 / k, "val_loss": quality, "grad_norm": 0.01}
                   for k in range(1, 41)]
        return stability.Cell((lr, clip), [TrialRecord(
            trial_id=f"{lr}-{clip}", values={"lr": lr, "grad_clip": clip}, seed=0,
            status="ok", history=history)])

    rows = [cell(0.01, 0.0, 0.30), cell(0.01, 0.5, 0.20), cell(0.01, 5.0, 0.25),
            cell(0.001, 0.5, 0.5)]
    quality = stability.Quality("val_loss", "min", 1.0)
    clip, why = stability.recommend_clip(rows, 0.01, quality, clip_is_second=True)
    assert clip == 0.5 and "0.01 × 0.5 is the best stable cell at 0.01" in why
    assert stability.recommend_clip(rows, 0.01, quality)[0] < 0.1, "norms: a clip never run"


def test_clips_that_tie_exactly_recommend_the_smallest_that_clips():
    """No clip engaged (grad norms 0.01), so 0, 0.5 and 5 ran identically: the grid says
    nothing against clipping, and the smallest clip tested guards against a spike."""
    def cell(clip: float) -> stability.Cell:
        history = [{"step": k, "loss": 1.0 / k, "val_loss": 0.2, "grad_norm": 0.01}
                   for k in range(1, 41)]
        return stability.Cell((0.01, clip), [TrialRecord(
            trial_id=f"{clip}", values={"lr": 0.01, "grad_clip": clip}, seed=0,
            status="ok", history=history)])

    quality = stability.Quality("val_loss", "min", 1.0)
    clip, why = stability.recommend_clip([cell(0.0), cell(5.0), cell(0.5)], 0.01, quality,
                                         clip_is_second=True)
    assert clip == 0.5 and "tie exactly" in why


def test_a_new_grid_keeps_the_previous_grids_files(tmp_path):
    """A second ``sweeps stability`` moved nothing aside: the first grid's table was gone."""
    from sweeps.commands.stability import keep_previous_grid

    out = tmp_path / "stability"
    assert keep_previous_grid(out) is None
    (out / "trials").mkdir(parents=True)
    for name in ("stability.csv", "stability.md", "preflight.md", "boundary.md"):
        (out / name).write_text(name)
    kept = keep_previous_grid(out)
    assert sorted(p.name for p in kept.iterdir()) == ["stability.csv", "stability.md", "trials"]
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["boundary.md",
                                                                  "preflight.md"]
    (out / "stability.csv").write_text("again")
    assert keep_previous_grid(out) != kept, "a second one in the same second gets its own"
    probe = keep_previous_grid(out, ("boundary.md",), "probe")  # a new probe's turn
    assert probe.name.startswith("probe-") and (probe / "boundary.md").read_text() == \
        "boundary.md"
    assert not (out / "boundary.md").exists()


def test_the_recommendation_names_the_same_boundary_as_the_grid():
    """The grid's boundary line said "between 0.2154 and 1" (its last cell before the
    cliff was too slow), the recommendation "between 0.0464 (stable) and 1"."""
    guess = math.log(10)

    def cell(lr: float, loss: float, status: str = "ok") -> stability.Cell:
        history = [{"step": k, "loss": 2.5 if k < 5 else loss} for k in range(1, 151)]
        runs = [TrialRecord(trial_id=f"{lr}-{s}", values={"lr": lr}, seed=s, status=status,
                            history=history, reason="non_finite" if status != "ok" else None)
                for s in (0, 1)]
        return stability.Cell((lr,), runs, guess=(guess, 0.05))

    rows = [cell(0.01, 0.5), cell(0.0464, 0.4), cell(0.2154, guess), cell(1.0, 9.0, "unstable")]
    assert [c.verdict() for c in rows] == ["stable", "stable", "too slow", "explodes"]
    assert stability.boundary(rows)[0].key == (0.2154,)
    _, why = stability.recommend(rows)
    assert why.startswith("boundary between 0.2154 (too slow) and 1 (explodes); the last "
                          "stable value below it is 0.0464"), why


def test_a_seed_at_the_guess_above_an_lr_that_learnt_is_dead_not_too_slow():
    """A CNN grid: at lr 0.2154 one seed learnt (0.864) and the other sat at the random
    guess until flat_at_baseline stopped it; the cell read ``too slow`` and the boundary
    went past it, while the boundary probe failed that very run. Above an LR whose seeds
    all learnt, such a seed failed: the cell is ``borderline`` (``dead`` when most did),
    and the boundary sits below it. Below every LR that learnt it stays too slow."""
    guess = math.log(10)

    def run(lr: float, seed: int, loss: float, status: str = "ok") -> TrialRecord:
        history = [{"step": k, "loss": 2.5 if k < 5 else loss} for k in range(1, 151)]
        return TrialRecord(trial_id=f"{lr}-{seed}", values={"lr": lr}, seed=seed,
                           status=status, role=stability.ROLE, history=history,
                           reason=None if status == "ok" else "flat_at_baseline")

    runs = [run(1e-4, 0, guess, "unstable"), run(1e-4, 1, guess, "unstable"),
            run(0.01, 0, 0.5), run(0.01, 1, 0.5), run(0.0464, 0, 0.4), run(0.0464, 1, 0.4),
            run(0.2154, 0, 0.6), run(0.2154, 1, guess, "unstable"),
            run(1.0, 0, guess, "unstable"), run(1.0, 1, guess),
            # blew up to 6.1 and came back to 2.2, below the guess: its loss did not fall
            run(2.0, 0, 2.2), run(2.0, 1, 2.25)]
    for r in runs[-2:]:
        r.history[0]["loss"] = 2.4
        r.history[20]["loss"] = 6.1
    rules = SimpleNamespace(baseline_loss=guess, flat_tolerance=0.05)
    book = SimpleNamespace(trials={r.trial_id: r for r in runs},
                           sweep=SimpleNamespace(spec=SimpleNamespace(rules=rules)))
    rows = stability.cells(book, "lr", None)
    assert [c.verdict() for c in rows] == ["too slow", "stable", "stable", "borderline", "dead",
                                           "dead"]
    reasons = [r["reasons"] for r in stability.table_rows(rows, ["lr"])]
    assert reasons[-3:] == ["flat_at_baseline", "flat_at_baseline, at the random guess",
                            "at the random guess"], "a dead cell says what its runs did"
    below, above = stability.boundary(rows)
    assert below.key == (0.0464,) and above.key == (0.2154,)
    _, why = stability.recommend(rows)
    assert why.startswith("boundary between 0.0464 (stable) and 0.2154 (borderline)"), why
    assert [c.verdict() for c in stability.cells(book, "dropout", None)][-1] == "too slow", \
        "over another knob a seed at the guess is slowness"


def test_ray_that_does_not_start_is_one_line_and_the_previous_grid_stays(linreg_dir, capsys,
                                                                        monkeypatch):
    """On a machine at load 24 the embedded Ray's node timed out starting: ``sweeps
    stability`` printed a traceback, having already moved the previous grid aside. The
    fault is injected (ray.init raising what Ray raised then): it cannot be caused here."""
    import ray

    def timed_out(*args, **kwargs):
        raise Exception("The current node timed out during startup. This could happen "
                        "because some of the raylet failed to startup or the GCS has "
                        "become overloaded.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # not the module's shared Ray
    monkeypatch.setattr(ray, "init", timed_out)
    monkeypatch.chdir(linreg_dir)
    earlier = linreg_dir / "results" / "linreg" / "stability"
    earlier.mkdir(parents=True)
    (earlier / "stability.csv").write_text("the earlier grid")
    for folder in (earlier, earlier.parent):  # as the earlier grid's run left them
        (folder / ".sweeps-results").touch()
    assert main(["stability", "linreg.yaml", "--no-preflight", "--seeds", "1", "--param",
                 "lr", "--values", "0.01,0.1"]) == 1
    err = capsys.readouterr().err
    assert "error: the embedded Ray did not start (The current node timed out during " \
           "startup." in err and "nothing ran" in err
    assert "Traceback" not in err
    assert (earlier / "stability.csv").read_text() == "the earlier grid"
    assert not [p for p in earlier.iterdir() if p.name.startswith("grid-")]


def test_a_grid_over_grad_clip_gives_one_recommendation_of_it():
    """Over ``--param grad_clip`` the grid recommends a clip it tested; the clip its grad
    norms suggest is said beside it, not as a second ``recommended grad_clip``."""
    import pandas as pd

    from sweeps.commands.stability import StabilityOutcome

    def outcome(names, recommended, clip):
        return StabilityOutcome(pd.DataFrame(), names, recommended, "best", clip,
                                "90th percentile of the grad norms is 18", None, "", [], [])

    over_clip = outcome(["grad_clip"], 1.0, 18.0).clip_line
    assert not over_clip.startswith("recommended")
    assert "grad_clip 18, which the grid did not test" in over_clip and "--values" in over_clip
    assert outcome(["grad_clip"], 18.0, 18.0).clip_line.startswith("grad norms: ")
    assert outcome(["lr"], 0.01, 18.0).clip_line.startswith("recommended grad_clip: 18 (")


def test_no_clip_best_by_less_than_its_seeds_vary_keeps_a_clip():
    """A user's VAE at lr 0.00562: no clip 19.4 (seeds 19.2-19.5), clip 1 19.5 (19.4-19.7):
    the grid said turn clipping off on a 0.5 % difference, and on fresh seeds clip 1 did
    better. A clipped cell whose mean lies within the no-clip cell's seeds is kept; one
    clearly worse is not."""
    def cell(clip: float, seeds: list[float]) -> stability.Cell:
        return stability.Cell((0.01, clip), [TrialRecord(
            trial_id=f"{clip}-{i}", values={"lr": 0.01, "grad_clip": clip}, seed=i,
            status="ok", history=[{"step": k, "loss": 1.0 / k, "val_loss": v, "grad_norm": 3.0}
                                  for k in range(1, 41)]) for i, v in enumerate(seeds)])

    quality = stability.Quality("val_loss", "min", None)
    rows = [cell(0.0, [19.2, 19.55]), cell(1.0, [19.4, 19.6]), cell(5.0, [19.35, 19.5])]
    clip, why = stability.recommend_clip(rows, 0.01, quality, clip_is_second=True)
    assert clip == 1.0 and "within its seeds' spread" in why
    rows = [cell(0.0, [19.2, 19.3]), cell(1.0, [20.4, 20.6])]
    assert stability.recommend_clip(rows, 0.01, quality, clip_is_second=True)[0] == 0.0


def test_a_fast_learner_is_stable_and_a_one_seed_lead_is_said_to_be_one():
    """A user's grid over grad_clip 0, 0.5, 1, 5: clip 0 and 5 never clipped and ran the
    same, yet read ``too slow`` (their loss fell most of the way in its first tenth, which
    was the reference), the text said "no value failed up to 1" of a grid up to 5, and
    clip 1 was recommended on one seed's difference with no word of it."""
    def cell(clip: float, seeds: list[float]) -> stability.Cell:
        history = [{"step": k, "loss": 1.0 if k == 1 else 0.5 + 0.4 / k} for k in range(1, 201)]
        return stability.Cell((clip,), [TrialRecord(
            trial_id=f"{clip}-{i}", values={"grad_clip": clip}, seed=i, status="ok",
            history=[*history[:-1], {**history[-1], "val_loss": v}])
            for i, v in enumerate(seeds)])

    quality = stability.Quality("val_loss", "min", None)
    rows = [cell(0.0, [0.599, 0.676]), cell(0.5, [0.611, 0.663]), cell(1.0, [0.599, 0.613]),
            cell(5.0, [0.599, 0.676])]
    assert [c.verdict() for c in rows] == ["stable"] * 4
    value, why = stability.recommend(rows, quality)
    assert value == 1.0 and why.startswith("no value failed up to 5;")
    assert "the lead (0.0315) is less than the seeds vary (0.077): on these seeds the two " \
           "are not told apart" in why
    one_seed = [cell(1.0, [0.599]), cell(5.0, [0.638])]
    assert "one seed per cell cannot tell a lead from seed noise" in \
        stability.recommend(one_seed, quality)[1]
