"""CSV files a user opens in a spreadsheet: text that would run as a formula is quoted."""

from __future__ import annotations

import pandas as pd

from sweeps.results.files import cell_text, write_csv


def test_formula_text_is_neutralised_and_numbers_are_untouched(tmp_path):
    frame = pd.DataFrame({
        "trial_id": ["a", "b", "c", "d"],
        "error": ["=HYPERLINK(\"http://x\")", "@SUM(A1)", "ValueError: bad", None],
        "optimizer": ["-adam", "+1", "-0.5", "sgd"],
        "val_loss": [-1.5, 0.2, float("nan"), 3.0],
    })
    write_csv(tmp_path / "t.csv", frame)
    back = pd.read_csv(tmp_path / "t.csv", dtype={"optimizer": str})
    assert list(back["error"][:3]) == ["'=HYPERLINK(\"http://x\")", "'@SUM(A1)",
                                       "ValueError: bad"]
    assert list(back["optimizer"]) == ["'-adam", "+1", "-0.5", "sgd"]
    assert back["val_loss"][0] == -1.5, "numbers keep their sign"
    assert cell_text("'-adam") == "-adam" and cell_text("'quoted") == "'quoted"
    assert frame["error"][0].startswith("="), "the caller's frame is not changed"
