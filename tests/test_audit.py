"""``sweeps audit``: stopped trials re-run to full length with the rules only watching.

A real linreg sweep (tests/sweepfiles) with planted trials: a truly stuck LR (1e-5,
flat_at_baseline), an exploding one (20, grad_blowup / non_finite), and two slow
learners that a deliberately too-strict flat_at_baseline setting (a wide band, a short
patience) stops at step ~31 while their loss is still inside the band: one that reaches
near the best by the end (a false alarm) and one that stays well short of it.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import shutil

import pandas as pd
import pytest

from sweeps.protocol import PRUNED, REASON_KEY, STATUS_KEY
from sweeps.record.objectives import quality_gap
from sweeps.results.audit import (
    Rerun,
    held_until,
    judge,
    per_rule,
    pick,
    rule_line,
    run_line,
    stopped_trials,
)
from sweeps.rules.settings import RuleSettings
from sweeps.trial.reporter import TrialReporter
from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

STUCK, EXPLODING, SLOW_GOOD, SLOW_POOR = 1.0e-5, 20.0, 0.005, 0.002
HEALTHY = [0.1, 0.05]
STEPS = 200
LINE = re.compile(r"^(\w+): (\d+)(?: of \d+)? audited, (\d+) failed, (\d+) poor, "
                  r"(\d+) recovered: precision (\d+) %, strict (\d+) %"
                  r"(?:; the named state held through half the rest of the run in (\d+) of \d+)?$")


def _strict_flat_rules() -> dict:
    """flat_at_baseline set too strict on purpose: a band of 60 % around the baseline and
    30 steps of patience stop a slow learner at step ~31 (its loss is still above 0.4)."""
    rules = {"baseline_loss": 1.0, "flat_tolerance": 0.6, "flat_patience": 30}
    if "flat_min_progress" in RuleSettings.model_fields:  # a rule that spares slow learners:
        rules["flat_min_progress"] = 0.9                   # make it call them stuck anyway
    return rules


def _cli(folder, *argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli_in(folder, *argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def audited(tmp_path_factory, ray_session):
    folder = copy_sweepfiles(tmp_path_factory.mktemp("audit"))
    lrs = [STUCK, EXPLODING, SLOW_GOOD, SLOW_POOR, *HEALTHY]
    edit_linreg(folder, name="audit", rules=_strict_flat_rules(),
                initial_points=[{"lr": lr} for lr in lrs],
                budget={"trials": len(lrs), "max_steps": STEPS, "concurrent": 2,
                        "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    out = folder / "results" / "audit"
    code, printed, err = _cli(folder, "audit", str(out))
    assert code == 0, err
    return out, printed


def _audit(out):
    return read_results_csv(out / "audit.csv")


def _by_lr(out, lr):
    rows = _audit(out)
    return rows[(rows["lr"] - lr).abs() < 1e-12 * max(1.0, lr)].iloc[0]


def _best(out):
    trials = read_results_csv(out / "trials.csv")
    ok = trials[(trials["role"] == "search") & (trials["status"] == "ok")]
    return float(ok["objective_val_loss"].min())


@pytest.mark.slow
def test_every_stopped_trial_is_rerun_to_full_length_without_a_stop(audited):
    out, _ = audited
    trials = read_results_csv(out / "trials.csv")
    stopped = trials[(trials["role"] == "search") & (trials["status"] == "unstable")]
    assert len(stopped) == 4, trials[["lr", "status", "reason", "stop_step"]]
    rows = _audit(out)
    assert sorted(rows["trial_id"]) == sorted(stopped["trial_id"])
    for row in rows.itertuples():
        orig = stopped[stopped["trial_id"] == row.trial_id].iloc[0]
        assert row.reason == orig["reason"] and row.stop_step == orig["stop_step"]
        assert row.seed == orig["seed"] and math.isclose(row.lr, orig["lr"])
        assert int(orig["steps"]) < STEPS, "the search stopped it early"
        assert row.steps == STEPS and row.status == "ok"
        hist = pd.read_csv(out / "audit" / f"{row.trial_id}.csv")
        assert list(hist["step"]) == list(range(1, STEPS + 1)), "never stopped"
        assert row.rerun_reason == orig["reason"], "same seed, same verdict"
        assert row.rerun_step == orig["stop_step"]


@pytest.mark.slow
def test_stuck_and_exploding_trials_failed(audited):
    out, _ = audited
    stuck = _by_lr(out, STUCK)
    assert stuck["reason"] == "flat_at_baseline" and stuck["outcome"] == "failed"
    assert "random-guess" in stuck["why"] and stuck["quality"] > 0.9
    assert stuck["held_until"] == stuck["steps"], "flat at the random guess to the end"
    boom = _by_lr(out, EXPLODING)
    assert boom["reason"] in ("non_finite", "grad_blowup", "divergence")
    assert boom["outcome"] == "failed" and "non-finite" in boom["why"]


@pytest.mark.slow
def test_slow_learners_are_judged_by_how_they_really_ended(audited):
    out, _ = audited
    best = _best(out)
    outcomes = {}
    for lr in (SLOW_GOOD, SLOW_POOR):
        row = _by_lr(out, lr)
        assert row["reason"] == "flat_at_baseline" and row["stop_step"] <= 40
        hist = pd.read_csv(out / "audit" / f"{row['trial_id']}.csv")
        val = hist["val_loss"].dropna()
        at_stop = hist[hist["step"] <= row["stop_step"]]["loss"]
        assert at_stop.tail(20).mean() > 0.4, "still inside the band when it was stopped"
        assert val.iloc[-1] < val.iloc[0] and math.isclose(row["quality"], val.iloc[-1])
        gap = quality_gap(val.iloc[-1], best, "min", 1.0)
        assert math.isclose(row["gap"], gap, rel_tol=1e-9)
        assert row["outcome"] == ("recovered" if gap <= 0.10 else "poor")
        assert row["stop_step"] <= row["held_until"] < row["steps"], "it left the band"
        outcomes[lr] = row["outcome"]
    assert outcomes == {SLOW_GOOD: "recovered", SLOW_POOR: "poor"}, "the planted cases"


@pytest.mark.slow
def test_printed_precision_matches_audit_csv(audited):
    out, printed = audited
    lines = {m.group(1): m.groups()[1:] for m in map(LINE.match, printed.splitlines()) if m}
    table = per_rule(_audit(out))
    assert set(lines) == set(table["rule"])
    for rec in table.to_dict(orient="records"):
        n, failed, poor, recovered, precision, strict = map(int, lines[rec["rule"]][:6])
        held = lines[rec["rule"]][6]
        assert (held is None) == (rec["state_held"] is None or math.isnan(rec["state_held"]))
        assert (n, failed, poor, recovered) == (rec["audited"], rec["failed"], rec["poor"],
                                                 rec["recovered"])
        assert precision == round(100 * (1 - recovered / n))
        assert strict == round(100 * failed / n)
    assert lines["flat_at_baseline"][:4] == ("3", "1", "1", "1")
    assert lines["flat_at_baseline"][4] == "67"
    # the stuck run and the poor slow learner (band left at step ~132 of 200) kept the
    # state; the good slow learner left it at step ~62, 31 reports after its stop; the
    # exploding run's loss kept its climb until it went non-finite
    assert lines["flat_at_baseline"][6] == "2" and lines["divergence"][6] == "1"
    assert "audit.csv" in printed and "audit.md" in printed


@pytest.mark.slow
def test_audit_md_and_the_report_section(audited):
    out, _ = audited
    text = (out / "audit.md").read_text()
    assert "## Per rule" in text and "flat_at_baseline" in text and "67 %" in text
    for trial_id in _audit(out)["trial_id"]:
        assert trial_id in text
    code, printed, err = _cli(out, "report", str(out))
    assert code == 0, err
    page = (out / "report.html").read_text()
    assert "Rule audit" in page and 'href="audit.md"' in page
    assert page.index("Rule audit") < page.index("id=trials")


@pytest.mark.slow
def test_sample_is_spread_over_the_reasons(audited, tmp_path):
    out, _ = audited
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("ray", "inductor_cache"))
    code, printed, err = _cli(tmp_path, "audit", str(copy), "--sample", "2", "--steps", "50",
                              "--trust-state")  # a copy is another folder than its seal's
    assert code == 0, err
    rows = _audit(copy)
    assert len(rows) == 2 and rows["reason"].nunique() == 2
    assert (rows["steps"] == 50).all()
    assert "of 3 audited" in printed, "says the rule stopped more than were re-run"
    assert sorted(p.stem for p in (copy / "audit").glob("*.csv")) == sorted(rows["trial_id"])


@pytest.mark.slow
def test_nothing_to_audit(audited, tmp_path):
    out, _ = audited
    for name in ("sweep.yaml", "sweep_state.json"):
        shutil.copy(out / name, tmp_path / name)
    trials = read_results_csv(out / "trials.csv")
    trials[trials["status"] == "ok"].to_csv(tmp_path / "trials.csv", index=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, printed, _ = _cli(tmp_path, "audit", str(tmp_path))
    assert code == 0 and "nothing to audit" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_a_folder_the_audit_cannot_write_is_refused_before_any_rerun(audited, tmp_path,
                                                                    monkeypatch):
    """On a read-only mount the audit re-ran every trial, then could not write its files.
    (This account is root here, which writes anywhere: the mount's refusal is injected.)"""
    import errno
    import tempfile

    out, _ = audited
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("ray", "inductor_cache", "audit*"))

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
    code, printed, err = _cli(tmp_path, "audit", str(copy), "--trust-state")
    assert code == 2 and "the audit cannot write its files there" in err, err
    assert "1/" not in printed and not (copy / "audit").exists(), "nothing was re-run"


def test_bad_folder_exits_2_and_writes_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, printed, err = _cli(tmp_path, "audit", str(empty))
    assert code == 2 and "no trials.csv" in err and "fix:" in err
    assert not list(empty.iterdir())
    half = tmp_path / "half"  # trials.csv but no sweep.yaml
    half.mkdir()
    (half / "trials.csv").write_text("trial_id,role,status,reason\nt1,search,unstable,x\n")
    code, printed, err = _cli(tmp_path, "audit", str(half))
    assert code == 2 and err.startswith("error: DIR:") and "sweep.yaml" in err
    assert [p.name for p in half.iterdir()] == ["trials.csv"]
    code, _, err = _cli(tmp_path, "audit", str(half), "--sample", "0")
    assert code == 2 and "--sample" in err


def test_observe_mode_records_the_first_verdict_and_never_stops():
    sink = []
    reporter = TrialReporter(RuleSettings(), sink.append, observe=True)
    for step in range(1, 21):
        loss = math.nan if step >= 5 else 1.0 / step
        reporter({"step": step, "loss": loss, "grad_norm": 1.0})
    assert len(reporter.history) == 20
    assert (reporter.verdict.reason, reporter.verdict.step) == ("non_finite", 5)
    marked = [r for r in sink if REASON_KEY in r]
    assert [r["step"] for r in marked] == [5], "only the first verdict is reported"
    assert all(r[STATUS_KEY] == "running" for r in sink)


def test_pick_round_robin_over_reasons():
    frame = pd.DataFrame({
        "trial_id": [f"t{i}" for i in range(9)], "role": ["search"] * 8 + ["confirm"],
        "status": ["unstable"] * 6 + ["pruned", "ok", "unstable"],
        "reason": ["a", "a", "a", "b", "b", "c", "", "", "a"],
        "diagnosis": [""] * 6 + ["", "", ""]})
    stopped = stopped_trials(frame)
    assert list(stopped["trial_id"]) == ["t0", "t1", "t2", "t3", "t4", "t5"]
    assert list(pick(stopped, 4)["trial_id"]) == ["t0", "t3", "t5", "t1"]
    assert list(pick(stopped, 2)["trial_id"]) == ["t0", "t3"]
    assert len(pick(stopped, 100)) == 6
    with_pruned = stopped_trials(frame, pruned=True)
    assert with_pruned.set_index("trial_id").loc["t6", "reason"] == PRUNED
    assert list(pick(with_pruned, 4)["trial_id"]) == ["t0", "t3", "t5", "t6"]


def _run(history, status="ok"):
    return Rerun("t", "flat_at_baseline", 10, {"lr": 1.0}, 0, history=history, status=status)


@pytest.mark.parametrize(("vals", "status", "outcome", "why"), [
    ([1.0, 0.5, 0.011], "ok", "recovered", "within"),
    ([1.0, 0.5, 0.2], "ok", "poor", "worse than the best"),
    ([1.0, 0.95, 0.96], "ok", "failed", "random-guess"),
    ([0.3, 0.2, 0.35], "ok", "failed", "worse than it started"),
    ([1.0, math.nan, 0.01], "ok", "failed", "non-finite"),
    ([1.0, 0.5], "crash", "failed", "crash"),
])
def test_judge_outcomes(vals, status, outcome, why):
    hist = [{"step": i + 1, "loss": v, "val_loss": v} for i, v in enumerate(vals)]
    run = judge(_run(hist, status), "val_loss", "min", best=0.01, baseline=1.0,
                tolerance=0.1, margin=0.1)
    assert run.outcome == outcome and why in run.why


@pytest.mark.parametrize(("loss", "acc", "baseline", "outcome", "why"), [
    (0.50, 0.6328, 1 / 3, "poor", "15% worse than the best 0.6836 (a share of its "
     "improvement over the random guess 0.3333)"),
    (0.50, 0.66, 1 / 3, "recovered", "within"),
    (1.09, 0.34, 1 / 3, "failed",
     "ended at eval_accuracy 0.34, no better than the random-guess 0.3333"),
    # the loss at its random guess (small logits) while the accuracy is well above chance
    (1.09, 0.60, 1 / 3, "poor", "worse than the best"),
    # no baseline declared for the accuracy: the training loss is judged against its own
    (1.09, 0.60, None, "failed", "ended at loss 1.09, no better than the random-guess 1.099"),
])
def test_an_accuracy_is_judged_against_its_own_baseline_and_the_loss_against_the_loss(
        loss, acc, baseline, outcome, why):
    """A max objective (3-class accuracy, random guess 1/3) with the loss's own random
    guess (ln 3): the loss is never compared with the accuracy's baseline, and with a
    declared baseline the accuracy says whether the run ended at the random guess."""
    hist = [{"step": 1, "loss": 1.1, "eval_accuracy": 0.33},
            {"step": 2, "loss": loss, "eval_accuracy": acc}]
    run = judge(_run(hist), "eval_accuracy", "max", best=0.6836, baseline=baseline,
                tolerance=0.05, margin=0.1, loss_baseline=math.log(3))
    assert run.outcome == outcome and why in run.why, run.why


def test_a_pruned_trial_is_audited_under_its_diagnosis_and_asha_cuts_get_no_precision():
    frame = pd.DataFrame({
        "trial_id": ["t0", "t1", "t2"], "role": ["search"] * 3,
        "status": ["pruned", "pruned", "unstable"], "reason": ["", "", "collapse"],
        "diagnosis": ["collapse at step 30 (since step 1)", "", ""]})
    reasons = stopped_trials(frame, pruned=True).set_index("trial_id")["reason"]
    assert reasons.to_dict() == {"t0": "pruned · collapse", "t1": PRUNED, "t2": "collapse"}
    rows = pd.DataFrame({"reason": ["pruned · collapse", PRUNED, PRUNED],
                         "outcome": ["failed", "recovered", "recovered"]})
    table = per_rule(rows).set_index("rule")
    assert table.loc["pruned · collapse", "precision"] == 1.0
    assert math.isnan(table.loc[PRUNED, "precision"])
    assert "no precision" in rule_line(table.reset_index().iloc[1].to_dict())


def test_held_until_is_where_the_named_state_first_broke_after_the_stop():
    """A collapse stop at step 69 whose outputs spread at step 225 (a quickstart run
    that ended poor at val_loss 1.47) held through 224; a flat stop whose loss stayed at
    the random guess held to the end; other reasons name no state."""
    spread = [{"step": s, "pred_std": 0.01 if s < 225 else 0.5, "target_std": 0.58}
              for s in range(1, 301)]
    assert held_until(Rerun("c", "collapse", 69, {}, 0, history=spread), RuleSettings()) == 224
    flat = [{"step": s, "loss": 1.5708 + (0.05 if s % 2 else -0.05)} for s in range(1, 301)]
    settings = RuleSettings(baseline_loss=1.5708)
    assert held_until(Rerun("f", "flat_at_baseline", 60, {}, 0, history=flat), settings) == 300
    learning = [dict(r, loss=r["loss"] - (0.004 * (r["step"] - 100) if r["step"] > 100 else 0))
                for r in flat]
    got = held_until(Rerun("f", "flat_at_baseline", 60, {}, 0, history=learning), settings)
    assert 100 < got < 150  # the running mean left the 5 % band a few reports after 120
    assert held_until(Rerun("g", "grad_blowup", 60, {}, 0, history=flat), settings) is None
    assert held_until(Rerun("f", "flat_at_baseline", 60, {}, 0, history=flat),
                      RuleSettings()) is None  # no baseline: no band


def test_a_divergence_stop_held_while_the_loss_kept_half_its_climb():
    """An explosion at step 3 (1.77 -> 47.7 -> 19.0 under clipping) that trained on to a
    fair loss (a CNN's audit ended it at val_loss 0.288, "poor") did not stay diverged:
    its state broke within a few reports. A loss that climbed and stayed up held."""
    losses = [1.77, 47.7, 19.0, 14.1, 22.1, 22.7, 9.2, 6.2, 3.0, 2.3] + \
        [2.0 * 0.99 ** s for s in range(190)]
    back = [{"step": s, "loss": v} for s, v in enumerate(losses, start=1)]
    run = Rerun("d", "divergence", 3, {}, 0, history=back, outcome="poor", why="trails")
    run.held_until = got = held_until(run, RuleSettings())
    assert got is not None and got < 20
    assert f"the loss kept half its climb through step {got} of 200" in run_line(run, "loss")
    stays = [{"step": s, "loss": 1.77 if s < 3 else 40.0 + s % 3} for s in range(1, 201)]
    assert held_until(Rerun("d", "divergence", 3, {}, 0, history=stays), RuleSettings()) == 200


def test_a_run_at_its_labels_own_guess_failed_with_no_baseline_declared(linreg_dir):
    """Unequal classes, no rules.baseline_loss: a re-run at the labels' entropy (1.61) and
    at the majority class's accuracy failed, where it used to read "poor"; the declared
    accuracy baseline below the majority share is raised to it."""
    from sweeps.results.audit import random_guesses
    from sweeps.spec.loader import load_sweep
    from tests.conftest import edit_linreg

    edit_linreg(linreg_dir, objectives=[{"metric": "val_loss", "mode": "min"},
                                        {"metric": "val_acc", "mode": "max", "baseline": 0.35}],
                rules={"baseline_loss": None})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    dead = [{"step": s, "loss": 1.65, "label_entropy": 1.61, "label_majority": 0.365,
             "val_loss": 1.604, "val_acc": 0.3647} for s in range(1, 201)]
    guesses = random_guesses(sweep, dead)
    assert guesses == [("val_loss", "min", 1.61), ("val_acc", "max", 0.365),
                       ("loss", "min", 1.61)]
    run = judge(_run(dead), "val_loss", "min", best=0.176, baseline=None, tolerance=0.05,
                margin=0.1, guesses=guesses)
    assert run.outcome == "failed" and "ended at val_loss 1.604" in run.why, run.why
    learnt = [dict(r, val_loss=0.288, val_acc=0.93) for r in dead]
    run = judge(_run(learnt), "val_loss", "min", best=0.176, baseline=None, tolerance=0.05,
                margin=0.1, guesses=random_guesses(sweep, learnt))
    assert run.outcome == "poor"
    no_labels = [{k: v for k, v in r.items() if not k.startswith("label_")} for r in dead]
    assert random_guesses(sweep, no_labels) == [("val_acc", "max", 0.35)]
    run = judge(_run(no_labels), "val_loss", "min", best=0.176, baseline=None,
                tolerance=0.05, margin=0.1, guesses=random_guesses(sweep, no_labels))
    assert run.outcome == "failed" and "val_acc 0.3647" in run.why, run.why
    # a macro-F1 is no accuracy: the majority class's share is not its random guess (a
    # Hugging Face user's declared 0.143 was read as 0.397, and a run at 0.35 that was
    # learning would have been called failed)
    edit_linreg(linreg_dir, objectives=[{"metric": "eval_macro_f1", "mode": "max",
                                         "baseline": 0.143}])
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    assert random_guesses(sweep, dead)[0] == ("eval_macro_f1", "max", 0.143)
