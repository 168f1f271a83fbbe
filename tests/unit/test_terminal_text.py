"""Text from a trainer, a knob or a folder: printed as text, cleaned of escape codes, quoted
in CSV headers, drawn literally by matplotlib; a trial's metric keys bounded (issue #24)."""

from __future__ import annotations

import contextlib
import io
import os

import pandas as pd
import pytest
from rich.table import Table

from sweeps.results import plots
from sweeps.results.files import write_csv
from sweeps.results.folder_data import read_csv
from sweeps.rules.settings import RuleSettings
from sweeps.terminal import clean, console
from sweeps.trial.reporter import TrialReporter
from tests.conftest import run_cli_in

MAX_METRIC_KEYS = 1000  # the bound of sweeps.trial.reporter (checked at the end)
HOSTILE = ("bad [/INST] [bold]x[/] :smile: \x1b[31mred\x1b[0m \x1b]0;title\x07"
           "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x9b2J\x00\x08\r\x7f end\tok\n")


def test_clean_removes_escape_sequences_and_control_characters_only():
    assert clean(HOSTILE) == "bad [/INST] [bold]x[/] :smile: red link  end\tok\n"
    assert clean("ünïcode [ok] $x^2$") == "ünïcode [ok] $x^2$"
    assert clean(3.5) == "3.5"
    # bidirectional controls reorder what a terminal shows: "note=\u202etxt.exe" reads
    # "note=exe.txt"; right-to-left text itself stays
    assert clean("note=\u202etxt.exe \u2066x\u2069 \u200fשלום") == "note=txt.exe x שלום"


def test_the_console_prints_markup_as_text_and_cleans_tables():
    out = io.StringIO()
    shown = console(file=out)
    shown.print(HOSTILE)
    table = Table(title="[/INST] \x1b[2J")
    table.add_column("\x1b[31m[/x]")
    table.add_row(HOSTILE.replace("\n", ""))
    shown.print(table)
    printed = out.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed and "\x9b" not in printed
    assert "bad [/INST] [bold]x[/] :smile: red" in printed and "[/x]" in printed
    assert "title" not in printed and printed.count("end") == 2, "a title sequence, not more"


def test_a_piped_console_keeps_table_rows_whole(monkeypatch):
    """Off a terminal (a pipe, a log) a table is as wide as its cells, not wrapped at 80."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    table = Table()
    for name in ("lr", "max_grad_norm", "loss_decreased", "stable_seeds", "reasons",
                 "val_loss (min–max)", "gap", "verdict"):
        table.add_column(name)
    table.add_row("0.001", "5.608", "True", "2/2", "", "0.677 (0.664–0.691)", "+42%",
                  "stable, poor")
    console(file=out).print(table)
    assert "0.677 (0.664–0.691)" in out.getvalue() and "stable, poor" in out.getvalue()


def test_csv_headers_are_quoted_like_cells_and_read_back(tmp_path):
    frame = pd.DataFrame({"step": [1], '=HYPERLINK("http://x")': [1.0], "-0.5": [2.0],
                          "@cmd": ["=1+1"]})
    write_csv(tmp_path / "h.csv", frame)
    header = (tmp_path / "h.csv").read_text().splitlines()[0]
    assert header == "step,\"'=HYPERLINK(\"\"http://x\"\")\",-0.5,'@cmd"
    assert list(read_csv(tmp_path / "h.csv").columns) == list(frame.columns)


def test_knob_values_that_read_as_math_are_drawn_as_text(tmp_path):
    search = pd.DataFrame({"trial_id": ["a", "b", "c"], "lr": [0.1, 0.01, 0.001],
                           "tag": ["$x^$", "$x^2$", "[/INST]"], "status": ["ok"] * 3,
                           "reason": ["", "", "$\\bad{$"]})
    path = plots.stability_map(search, "lr", "tag", {"tag": "categorical"}, set(),
                               tmp_path / "map.png")
    assert path is not None and path.stat().st_size > 0
    assert plots.plain("$x^2$ at $5") == r"\$x^2\$ at \$5", "drawn as typed, not as x²"


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)], ids=["022", "027"])
def test_plots_take_their_mode_from_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = plots.curves_plot([plots.Curve("t1", pd.DataFrame({"step": [1, 2],
                                                                    "loss": [1.0, 0.5]}))],
                                 "curves", tmp_path / "c.png")
    finally:
        os.umask(old)
    assert path is not None and path.stat().st_mode & 0o777 == mode


def test_a_trial_keeps_its_first_metric_keys_and_says_which_it_dropped():
    results: list[dict] = []
    report = TrialReporter(RuleSettings(), results.append, required=("late_objective",))
    many = {f"k{i}": 0.0 for i in range(2 * MAX_METRIC_KEYS)}
    for step in range(1, 4):
        report({"step": step, **many, "loss": 1.0, "late_objective": 0.5})
    assert all(len(entry) <= MAX_METRIC_KEYS + 3 for entry in report.history)
    assert {"loss", "late_objective", "step_time", "k0"} <= report.history[-1].keys()
    assert f"k{MAX_METRIC_KEYS}" not in report.history[-1]
    warnings = [r["sweeps/warning"] for r in results if "sweeps/warning" in r]
    assert len(warnings) == 1, "warned once"
    assert f"only the first {MAX_METRIC_KEYS}" in warnings[0]
    assert f"dropped 'k{MAX_METRIC_KEYS - 1}'" in warnings[0], "the first key past the bound"
    from sweeps.trial.reporter import MAX_METRIC_KEYS as bound

    assert bound == MAX_METRIC_KEYS


def test_audits_refusal_names_the_audit_command(tmp_path):
    folder = tmp_path / "foreign"
    folder.mkdir()
    (folder / "trials.csv").write_text("trial_id,role,status,reason\nt1,search,unstable,x\n")
    (folder / "sweep.yaml").write_text("name: foreign\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = run_cli_in(tmp_path, "audit", str(folder))
    assert code == 2
    fix = err.getvalue().split("fix:", 1)[1]
    assert f"sweeps audit {folder} --trust-state" in fix and "sweeps resume" not in fix


def test_the_summary_names_front_members_the_race_did_not_judge(capsys):
    """A front larger than confirm.keep: the summary said "Pareto front: 4 trial(s); 3
    candidate(s) judged", which read as if the whole front was judged."""
    from types import SimpleNamespace as NS

    from sweeps.commands.cli import print_selection
    from sweeps.results.confirm import BaseReference, SeedRun
    from sweeps.spec.loader import Objective

    judged = [NS(trial_id=t, verdict="confirmed") for t in ("a1", "b2", "c3")]
    chosen = NS(candidates=judged, fragile=[], steps={"search": 100}, notes=[],
                handed_over=[], base_id=None, base=None, base_line=lambda: None,
                base_tie=lambda: None, budget_ended=False)
    outcome = NS(selection=chosen, front=[NS(trial_id=t) for t in ("a1", "b2", "c3", "d4")],
                 sweep=NS(objectives=[NS(metric="val_loss")], fixed_changes={},
                          spec=NS(budget=NS(scheduler="asha", asha_grace=50))),
                 stable_paths=[], warnings=[], book=NS(trials={}))
    print_selection(outcome)
    out = " ".join(capsys.readouterr().out.split())
    assert "Pareto front: 4 trial(s) (1 of the front not judged: the race takes the best " \
           "confirm.keep by quality; d4 in trials.csv); 3 candidate(s) judged" in out
    chosen.budget_ended = True  # the step budget stopped the settling: that is why
    print_selection(outcome)
    out = " ".join(capsys.readouterr().out.split())
    assert "(1 of the front not judged: the step budget ended first (see the note below); " \
           "d4 in trials.csv)" in out
    assert "your base config" not in out
    # the base config (the search's first trial) stopped by a rule is said to be
    chosen.base_id = "e5"
    chosen.base = BaseReference({}, Objective(metric="val_loss", mode="min"),
                                [SeedRun(0, "unstable", "flat_at_baseline", 121, 1.5)],
                                search_seed=0, trial_id="e5")
    print_selection(outcome)
    assert "your base config went unstable" not in capsys.readouterr().out, \
        "nothing handed over: nothing to compare with it"
    outcome.stable_paths = ["stable/rank-01-a1.yaml"]
    print_selection(outcome)
    out = " ".join(capsys.readouterr().out.split())
    assert "note: your base config went unstable (seed 0: flat_at_baseline @ 121) and ran " \
           "on no fresh seed, so what the sweep hands over is not compared with your base " \
           "config on fresh seeds" in out and "(trial e5, the search's first" in out


def test_a_slow_start_asha_cut_at_the_guess_is_told_to_raise_the_grace(tmp_path) -> None:
    """A slow learner: ASHA cut 11 of 12 search trials at its first rung while their loss
    still sat at the random guess. "Check that the labels reach the loss" sent the user
    after a data bug; what they needed was a longer budget.grace_steps."""
    from types import SimpleNamespace as NS

    from sweeps.commands.cli import none_held
    from tests.unit.conftest import book_of, load_linreg, rec

    sweep = load_linreg(tmp_path)
    flat = {"reason": "flat_at_baseline", "step": 50, "evidence": {}}
    cut = [rec(f"s{i}", status="pruned", val_loss=2.3) for i in range(11)]
    for r in cut:
        r.diagnosis = flat
    stopped = rec("s11", status="unstable", val_loss=2.3)
    stopped.reason = "flat_at_baseline"
    chosen = NS(candidates=[])
    text = " ".join(none_held(book_of(sweep, *cut, stopped), chosen, 50).split())
    assert "every one sat at the random guess, 11 of them cut by ASHA by step 10 " \
           "(budget.grace_steps 50 after each trial's warmup)" in text
    assert "Raise budget.grace_steps" in text
    # the rule itself stopped them, ASHA cut none: the labels are the suspect
    for r in cut:
        r.status, r.reason, r.diagnosis = "unstable", "flat_at_baseline", None
    text = " ".join(none_held(book_of(sweep, *cut, stopped), chosen, 50).split())
    assert "grace_steps" not in text and "check that the labels reach the loss" in text
