"""`sweeps stability` on a trainer whose divergence boundary is known.

Plain SGD on standardised linear regression: the minibatch loss Hessian's
largest eigenvalue is ~2.6 at most, so LR ≤ 0.5 is stable, LR ≥ 0.9 spikes
or blows up, LR 1e-5 does not learn within the budget.
"""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from sweeps import stability
from sweeps.cli import main

pytestmark = pytest.mark.slow


def test_lr_grid_places_the_boundary_and_recommends_below_it(linreg_dir, ray_session,
                                                            capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    code = main(["stability", "linreg.yaml", "--param", "lr", "--values",
                 "1e-5,0.01,0.1,0.5,2,5", "--seeds", "2", "--quiet", "--no-preflight"])
    assert code == 0
    out = capsys.readouterr().out
    table = pd.read_csv(linreg_dir / "results" / "linreg" / "stability.csv")
    verdicts = dict(zip(table["lr"], table["verdict"], strict=True))
    assert verdicts[1e-5] == "too slow"
    assert [verdicts[v] for v in (0.01, 0.1, 0.5)] == ["stable"] * 3
    assert verdicts[2.0] == verdicts[5.0] == "explodes"
    assert table.set_index("lr").loc[5.0, "stable_seeds"] == "0/2"
    assert "boundary: between 0.5 and 2 (explodes)" in out
    assert "recommended lr: 0.1" in out
    md = (linreg_dir / "results" / "linreg" / "stability.md").read_text()
    assert "between 0.5 and 2 (explodes)" in md and "recommended grad_clip" in md


def test_two_knob_map_and_clip_warning(linreg_dir, ray_session, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    data = yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    data["search_space"]["grad_clip"] = {"type": "uniform", "low": 0.0, "high": 10.0}
    data["write_back"]["grad_clip"] = "train.grad_clip"
    (linreg_dir / "linreg.yaml").write_text(yaml.safe_dump(data))
    assert main(["stability", "linreg.yaml", "--param", "lr", "--values", "0.01,5",
                 "--and", "grad_clip=0.01,10", "--seeds", "1", "--quiet",
                 "--no-preflight"]) == 0
    out = linreg_dir / "results" / "linreg"
    assert (out / "stability_map.png").stat().st_size > 1000
    table = pd.read_csv(out / "stability.csv")
    assert len(table) == 4 and set(table.columns) >= {"lr", "grad_clip", "verdict"}
    # the trainer ignores grad_clip, so every norm above 0.01 counts as clipped
    assert "clipped on" in capsys.readouterr().out


def test_boundary_logic_on_synthetic_cells():
    from sweeps.book import TrialRecord

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
