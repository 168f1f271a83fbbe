"""Text from a trainer reaches the terminal, CSV files and plots as text (issue #24).

A real sweep whose trainer raises an error holding rich markup (``[/INST]``, ordinary in
LLM fine-tuning) and terminal escape codes, reports a metric named like markup and one
named like a spreadsheet formula, and has a categorical knob whose values matplotlib would
read as math; and a real sweep whose trainer reports thousands of metric keys.
"""

from __future__ import annotations

import contextlib
import io
import os

import pandas as pd
import pytest

from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

ERROR = "bad [/INST] token \x1b[31mred\x1b]0;title\x07"
FORMULA = '=HYPERLINK("http://x")'
TAGS = ["$x^2$", "$x^$", "[/INST]"]  # the last one raises ERROR
MAX_METRIC_KEYS = 1000  # the bound of sweeps.trial.reporter (checked at the end)
TRAINER = f'''
def train(config, report):
    t = config["train"]
    for step in range(1, 4):
        report({{"step": step, "loss": 1.0 / step, "val_loss": 1.0 / step, "[/INST]": 0.5,
                {FORMULA!r}: 1.0, **{{f"k{{i}}": 0.0 for i in range(t["keys"])}}}})
    if t["tag"] == "[/INST]":
        raise RuntimeError({ERROR!r})
'''


def _sweep(folder, name: str, tags: list[str], keys: int = 0) -> None:
    """The linreg sweep run with the trainer above: one trial per tag, 3 steps each."""
    (folder / "text_trainer.py").write_text(TRAINER)
    edit_linreg(folder, name=name, trainer="text_trainer:train",
                search_space={"lr": {"type": "loguniform", "low": 1e-3, "high": 1.0},
                              "tag": {"type": "categorical", "choices": tags}},
                write_back={"lr": "train.lr", "tag": "train.tag"},
                initial_points=[{"lr": 0.1, "tag": t} for t in tags],
                budget={"trials": len(tags), "max_steps": 3, "concurrent": 2,
                        "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0}, train={"tag": tags[0], "keys": keys})


def _cli(folder, *argv: str) -> tuple[int, str]:
    """Exit code and everything printed (stdout and stderr) by ``sweeps ARGV``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = run_cli_in(folder, *argv)
    return code, out.getvalue()


def _as_text(printed: str) -> None:
    assert "\x1b" not in printed and "\x07" not in printed, "escape codes reached the terminal"
    assert "MarkupError" not in printed


@pytest.fixture(scope="module")
def text_sweep(tmp_path_factory, ray_session):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # no colours of rich's own in the output
        os.environ.pop(var, None)
    folder = copy_sweepfiles(tmp_path_factory.mktemp("text"))
    _sweep(folder, "text", TAGS)
    code, printed = _cli(folder, "run", "linreg.yaml", "--no-preflight")
    return folder, folder / "results" / "text", code, printed


@pytest.mark.slow
def test_a_trainer_error_with_markup_and_escape_codes_is_printed_as_text(text_sweep):
    folder, out, code, printed = text_sweep
    assert code == 0, printed  # two trials ok, one crashed: a sweep with a crash in it
    trials = read_results_csv(out / "trials.csv")
    assert sorted(trials["status"]) == ["crash", "ok", "ok"]
    crashed = trials[trials["status"] == "crash"].iloc[0]
    assert crashed["retries"] == 0, "a trainer's error is not a lost worker: no retry"
    assert "[/INST]" in crashed["evidence"]
    _as_text(printed)
    assert "bad [/INST] token red" in printed, "the error is shown, its escape codes gone"
    assert "tag=[/INST]" in printed, "the knob value is shown as text"

    code, again = _cli(folder, "resume", str(out))
    assert code == 0, again
    assert f"resuming sweep '{out.name}' in {out}: 3 trial(s) recorded" in again, again
    _as_text(again)
    assert "Trials of sweep" in again or "top search trials" in again


@pytest.mark.slow
def test_try_and_report_print_the_same_text_as_text(text_sweep):
    folder, out, _, _ = text_sweep
    code, printed = _cli(folder, "try", "linreg.yaml", "--set", 'tag="[/INST]"',
                         "--print-every", "1")
    assert code == 1, printed  # a trial that crashed
    _as_text(printed)
    assert "[/INST]=0.5" in printed and "bad [/INST] token red" in printed

    code, printed = _cli(folder, "report", str(out), "--pair", "lr,tag")
    assert code == 0, printed
    _as_text(printed)
    assert (out / "stability-lr-tag.png").stat().st_size > 0, "math text drew, as text"


@pytest.mark.slow
def test_the_reports_images_have_the_mode_of_the_report(text_sweep):
    folder, out, _, _ = text_sweep
    old = os.umask(0o022)
    try:
        code, printed = _cli(folder, "report", str(out))
    finally:
        os.umask(old)
    assert code == 0, printed
    images = sorted(out.glob("*.png"))
    assert images
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in [out / "report.html", *images]}
    assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.slow
def test_a_metric_named_like_a_formula_is_quoted_in_the_history_header(text_sweep):
    _, out, _, _ = text_sweep
    for path in (out / "trials").glob("*.csv"):
        header = path.read_text().splitlines()[0]
        assert f"'{FORMULA}" in header.replace('""', '"'), header


@pytest.mark.slow
def test_a_trial_keeps_a_bounded_number_of_metric_keys(tmp_path, ray_session):
    folder = copy_sweepfiles(tmp_path)
    _sweep(folder, "keys", ["a", "b"], keys=3 * MAX_METRIC_KEYS)  # 2 trials, 5 + 3000 keys
    code, printed = _cli(folder, "run", "linreg.yaml", "--quiet", "--no-preflight")
    assert code == 0, printed
    out = folder / "results" / "keys"
    for row in read_results_csv(out / "trials.csv").fillna("").itertuples():
        assert row.status == "ok"
        assert f"only the first {MAX_METRIC_KEYS} distinct keys" in row.warnings
        assert f"dropped 'k{MAX_METRIC_KEYS - 5}'" in row.warnings  # 5 named keys came first
        assert f"and {2 * MAX_METRIC_KEYS} more" in row.warnings
        history = pd.read_csv(out / "trials" / f"{row.trial_id}.csv")
        assert len(history) == 3 and len(history.columns) == MAX_METRIC_KEYS + 1  # step_time
        assert {"step", "loss", "val_loss", "step_time"} <= set(history.columns)
    from sweeps.trial.reporter import MAX_METRIC_KEYS as bound

    assert bound == MAX_METRIC_KEYS


PROBE_TRAINER = f'''
from linreg_trainer import train as _train


def loss_closure(config):
    raise ValueError({ERROR!r})


def train(config, report):
    if float(config["train"]["lr"]) > 0.5:
        raise RuntimeError({ERROR!r})
    _train(config, report)
'''


def test_the_boundary_probe_prints_a_trainers_text_as_text(linreg_dir):
    """A loss_closure that raises, and a trainer that crashes in a probe run, with markup
    and escape codes in their errors: the probe says both, as text (exit 1 for the crash)."""
    (linreg_dir / "probe_trainer.py").write_text(PROBE_TRAINER)
    edit_linreg(linreg_dir, trainer="probe_trainer:train")
    code, printed = _cli(linreg_dir, "stability", "linreg.yaml", "--param", "lr", "--probe",
                         "--seeds", "1", "--no-preflight")
    assert code == 1, printed
    _as_text(printed)
    assert "loss_closure failed (ValueError: bad [/INST] token red)" in printed
    assert "error: the trainer crashed" in printed and "bad [/INST] token red" in printed
