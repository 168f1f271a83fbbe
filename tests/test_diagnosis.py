"""A diagnosis for every stopped trial: what the rules see in a trial the scheduler pruned."""

from __future__ import annotations

import math

from sweeps.record.book import TrialBook
from sweeps.results.files import trials_frame
from sweeps.results.folder_data import load
from sweeps.results.summary import summary_of
from sweeps.rules import RuleSettings, diagnose
from sweeps.spec.loader import load_sweep
from tests.conftest import edit_linreg

B = math.pi / 2


def test_a_history_too_short_for_the_patience_is_diagnosed():
    flat = [{"step": s, "loss": B} for s in range(1, 76)]
    settings = RuleSettings(baseline_loss=B)  # patience 100: no verdict at step 75
    from sweeps.rules import evaluate

    assert evaluate(flat, settings) is None
    verdict = diagnose(flat, settings)
    assert verdict.reason == "flat_at_baseline" and verdict.evidence["flat_since_step"] == 1
    collapsed = [{"step": s, "loss": 1.0 - s / 200, "pred_std": 0.01, "target_std": 1.0}
                 for s in range(1, 41)]
    assert evaluate(collapsed, RuleSettings()) is None  # not judged before step 50
    assert diagnose(collapsed, RuleSettings()).reason == "collapse"


def test_a_learning_or_short_history_gets_no_diagnosis():
    learning = [{"step": s, "loss": B * (1 - 0.004 * s)} for s in range(1, 76)]
    assert diagnose(learning, RuleSettings(baseline_loss=B)) is None
    short = [{"step": s, "loss": B} for s in range(1, 8)]
    assert diagnose(short, RuleSettings(baseline_loss=B)) is None


def test_a_run_back_at_the_guess_for_the_second_half_is_diagnosed():
    # learnt to 0.5, spiked, then sat at the random guess until the scheduler cut it
    back = [{"step": s, "loss": 0.5 if s < 25 else (3.0 if s == 25 else B)}
            for s in range(1, 97)]
    verdict = diagnose(back, RuleSettings(baseline_loss=B))
    assert verdict.reason == "flat_at_baseline"
    assert verdict.evidence["flat_since_step"] == 49
    # the other way round (at the guess, then learning) is a slow start, not stuck
    late = [{"step": s, "loss": B if s < 48 else B * (1 - 0.01 * (s - 47))}
            for s in range(1, 97)]
    assert diagnose(late, RuleSettings(baseline_loss=B)) is None


def test_a_run_cut_at_an_evaluation_is_judged_on_its_training_loss():
    """Lightning's and Hugging Face's evaluations arrive as reports of their own, without
    a training loss, and a scheduler prunes on them: the history then ends on a report
    the rules do not judge, and no pruned trial of such a trainer had a diagnosis."""
    back = []
    for s in range(1, 161):
        back.append({"step": s, "loss": 0.5 if s < 25 else B})
        if s % 40 == 0:
            back.append({"step": s, "val_loss": B, "val_acc": 0.26})
    settings = RuleSettings(baseline_loss=B, quality_metric="val_acc", quality_mode="max",
                            quality_baseline=0.25)
    verdict = diagnose(back, settings)
    assert verdict is not None and verdict.reason == "flat_at_baseline"
    assert verdict.step == 160 and verdict.evidence["metric"] == "loss"
    # the evaluation it was cut at still speaks for its quality: well above chance
    learnt = [*back[:-1], {"step": 160, "val_loss": B, "val_acc": 0.9}]
    assert diagnose(learnt, settings) is None


def _pruned(book: TrialBook, trial_id: str, lr: float, losses: list[float]) -> None:
    for step, loss in enumerate(losses, start=1):
        book.record(trial_id, {"step": step, "loss": loss, "config": {"lr": lr}})
    book.finish(trial_id, None, error=False)  # ended neither ok nor failed: pruned


def test_a_pruned_trial_carries_its_diagnosis_to_the_sampler_csv_and_report(linreg_dir):
    edit_linreg(linreg_dir, rules={"baseline_loss": 1.0, "flat_patience": 200})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    book = TrialBook(sweep)
    _pruned(book, "stuck", 1e-5, [1.0] * 40)
    _pruned(book, "slow", 1e-3, [1.0 - 0.01 * s for s in range(40)])
    stuck, slow = book.trials["stuck"], book.trials["slow"]
    assert stuck.status == slow.status == "pruned"
    assert stuck.diagnosis["reason"] == "flat_at_baseline" and slow.diagnosis is None
    assert stuck.diagnosis_text() == "flat_at_baseline at step 40 (since step 1)"
    assert stuck.flagged and not slow.flagged
    objs = sweep.objectives
    assert book.penalised_values(stuck, objs)[1] >= 10.0, "told like an unstable trial"

    reread = TrialBook(sweep)  # the journal keeps it
    reread.load()
    assert reread.trials["stuck"].diagnosis == stuck.diagnosis

    frame = trials_frame(sweep, book)
    frame.to_csv(sweep.output_dir / "trials.csv", index=False)
    rows = frame.set_index("trial_id")
    assert rows.loc["stuck", "diagnosis"].startswith("flat_at_baseline")
    assert rows.loc["slow", "diagnosis"] == ""
    info = summary_of(load(sweep.output_dir))
    assert info["diagnoses"] == {"flat_at_baseline": 1}
    assert "pruned · flat_at_baseline" in [t["reason"] for t in info["taxonomy"]]
    assert info["failures"] == {}
    from sweeps.results.report import write_report

    html = write_report(sweep.output_dir).read_text()
    # the header said "failures by reason: none" above a taxonomy of a diagnosed cut
    assert "cut by ASHA, with what the rules saw in them: " in html
