"""trials.csv as the driver writes it (sweeps.results.files) and the report reads it back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from sweeps.commands.run import save_resolved
from sweeps.record.book import TrialRecord
from sweeps.record.objectives import FAILED_INSTABILITY
from sweeps.results import folder_data
from sweeps.results.files import (
    cell_text,
    compile_columns,
    safe_cell,
    trials_frame,
    write_csv,
    write_histories,
)
from sweeps.spec.loader import Sweep
from tests.unit.conftest import book_of


def _history(val_loss: float, steps: int = 10) -> list[dict[str, float]]:
    return [{"step": s, "loss": val_loss + 0.01 * (steps - s), "val_loss": val_loss,
             "grad_norm": 1.0, "step_time": 0.01} for s in range(1, steps + 1)]


def _records() -> list[TrialRecord]:
    ok = TrialRecord("0012", {"lr": 0.01}, 0, history=_history(0.2), status="ok")
    blown = TrialRecord("a1b2", {"lr": 20.0}, 0, history=_history(5.0, 4), status="unstable",
                        reason="divergence", stop_step=4,
                        evidence={"loss": 5.0, "baseline": 1.0},
                        warnings=["=cmd|' /C calc'!A0"])
    flat = TrialRecord("c3d4", {"lr": 1e-5}, 0, history=_history(1.0, 6), status="pruned",
                       diagnosis={"reason": "flat_at_baseline", "step": 6,
                                  "evidence": {"flat_since_step": 0}})
    rerun = TrialRecord("e5f6", {"lr": 0.01}, 7, role="confirm", history=_history(0.25),
                        status="ok")
    crash = TrialRecord("dead", {"lr": 0.1}, 0, status="crash", reason="crash",
                        error="Traceback: boom")
    return [ok, blown, flat, rerun, crash]


@pytest.fixture
def written(linreg_sweep: Sweep) -> tuple[Sweep, pd.DataFrame]:
    book = book_of(linreg_sweep, *_records())
    frame = trials_frame(linreg_sweep, book)
    save_resolved(linreg_sweep)
    write_csv(linreg_sweep.output_dir / "trials.csv", frame)
    write_histories(linreg_sweep.output_dir / "trials", book)
    return linreg_sweep, frame


def test_rows_in_book_order_with_knobs_and_objectives(written: tuple[Sweep, pd.DataFrame]
                                                      ) -> None:
    _, frame = written
    assert list(frame["trial_id"]) == ["0012", "a1b2", "c3d4", "e5f6", "dead"]
    assert list(frame.columns[:9]) == ["trial_id", "role", "status", "reason", "stop_step",
                                       "seed", "steps", "retries", "lr"]
    assert str(frame["steps"].dtype) == "Int64" and frame["steps"].tolist()[:3] == [10, 4, 6]
    assert frame.loc[0, "objective_val_loss"] == 0.2
    assert frame.loc[1, "objective_instability"] == FAILED_INSTABILITY  # as told to Optuna
    assert frame.loc[2, "objective_instability"] == FAILED_INSTABILITY
    assert frame.loc[2, "diagnosis"] == "flat_at_baseline at step 6 (since step 0)"
    assert json.loads(frame.loc[1, "evidence"]) == {"loss": 5.0, "baseline": 1.0}
    assert "gpu_peak_mb" not in frame and "compile_fallback" not in frame


def test_report_reads_back_what_was_written(written: tuple[Sweep, pd.DataFrame]) -> None:
    sweep, frame = written
    res = folder_data.load(sweep.output_dir)
    assert res.name == "linreg"
    assert res.trials["trial_id"].tolist() == ["0012", "a1b2", "c3d4", "e5f6", "dead"]
    assert res.objectives == ["val_loss", "instability"]
    assert res.knobs == ["lr"] and res.kinds == {"lr": "log"}
    assert res.baseline == 1.0
    assert res.search["trial_id"].tolist() == ["0012", "a1b2", "c3d4", "dead"]
    assert res.reruns["trial_id"].tolist() == ["e5f6"]
    assert res.trials["lr"].tolist() == frame["lr"].tolist()
    back = res.trials.set_index("trial_id")
    assert back.loc["a1b2", "reason"] == "divergence" and back.loc["0012", "reason"] == ""
    assert math.isclose(back.loc["0012", "objective_val_loss"], 0.2)
    # the formula-like warning was written defused and reads back as the text it was
    assert cell_text(back.loc["a1b2", "warnings"]) == "=cmd|' /C calc'!A0"
    raw = (sweep.output_dir / "trials.csv").read_text()
    assert "'=cmd" in raw


def test_report_taxonomy_of_failures(written: tuple[Sweep, pd.DataFrame]) -> None:
    sweep, _ = written
    res = folder_data.load(sweep.output_dir)
    tax = folder_data.taxonomy(res)
    assert [t["reason"] for t in tax] == ["divergence", "crash", "pruned · flat_at_baseline"]
    assert [t["trials"] for t in tax] == [1, 1, 1]
    assert tax[0]["status"] == "unstable" and tax[2]["status"] == "pruned"


def test_histories_and_tracebacks_written_per_trial(written: tuple[Sweep, pd.DataFrame]
                                                    ) -> None:
    sweep, _ = written
    folder = sweep.output_dir / "trials"
    assert sorted(p.name for p in folder.iterdir()) == [
        "0012.csv", "a1b2.csv", "c3d4.csv", "dead.error.txt", "e5f6.csv"]
    history = pd.read_csv(folder / "a1b2.csv")
    assert history["step"].tolist() == [1, 2, 3, 4]
    assert (folder / "dead.error.txt").read_text() == "Traceback: boom"


@pytest.mark.parametrize("value, safe", [
    ("=SUM(A1)", "'=SUM(A1)"), ("+1+1", "'+1+1"), ("@x", "'@x"), ("\tx", "'\tx"),
    ("-0.5", "-0.5"), ("-inf", "-inf"), ("ok", "ok"), (3, 3), (None, None)])
def test_safe_cell_round_trips(value: object, safe: object) -> None:
    assert safe_cell(value) == safe
    assert cell_text(safe_cell(value)) == value
    assert cell_text("'plain quote") == "'plain quote"


def test_no_compile_columns_without_a_compiled_mode(linreg_sweep: Sweep) -> None:
    rec = TrialRecord("t", {"lr": 0.1}, 0)
    assert compile_columns(linreg_sweep, rec) == {}
    rec.compile = {"graphs": 2}
    columns = compile_columns(linreg_sweep, rec)
    assert columns["compile_graphs"] == 2 and columns["compile_fallback"] == ""


def test_report_of_an_empty_folder(tmp_path: Path) -> None:
    res = folder_data.load(tmp_path)
    assert res.trials.empty and res.objectives == [] and res.stable == []
