"""The report's knob-importance panel: which knobs mattered (PED-ANOVA on the sweep's
Optuna study) and which choices were barely tried, on a real sweep and on real studies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from sweeps.results.importance import (
    MIN_CLASS,
    MIN_TRIALS,
    open_study,
    quality,
    stability,
    under_explored,
)
from sweeps.results.report import write_report
from sweeps.results.summary import summary
from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in
from tests.test_report import make_sweep

TAGS = ["a", "b", "c", "d", "e", "f"]  # a knob the trainer never reads, six choices


@pytest.fixture(scope="module")
def tagged_run(tmp_path_factory, ray_session) -> Path:
    """The linreg sweep (lr decides quality and stability) plus a dead categorical knob:
    12 trials over 6 tags leave some tag with fewer than 3 trials (12 < 6 x 3)."""
    folder = copy_sweepfiles(tmp_path_factory.mktemp("tagged"))
    edit_linreg(folder, new_keys=True,
                search_space={"tag": {"type": "categorical", "choices": TAGS},
                              "lr": {"type": "loguniform", "low": 2.0e-3, "high": 10.0}},
                write_back={"tag": "train.tag"},
                initial_points=[{"lr": lr} for lr in (8.0, 5.0, 4.0, 3.0, 2.0, 0.05, 0.01)],
                budget={"trials": 12}, confirm={"seeds": 1, "lr_probe": 0, "keep": 1,
                                                "max_candidates": 1, "base": False})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet") == 0
    return folder / "results" / "linreg"


@pytest.mark.slow
def test_panel_ranks_the_knobs_for_quality_and_stability(tagged_run: Path) -> None:
    info = summary(tagged_run)
    json.dumps(info, allow_nan=False)
    imp = info["importance"]
    assert imp["evaluator"] == "PED-ANOVA" and imp["note"] == ""
    search = read_results_csv(tagged_run / "trials.csv").query("role == 'search'")
    ok, bad = (search["status"] == "ok").sum(), search["status"].isin(["unstable", "crash"]).sum()
    stab = imp["targets"]["stability"]
    assert (stab["stable"], stab["unstable"]) == (len(search) - bad, bad)
    assert bad >= MIN_CLASS and len(search) - bad >= MIN_CLASS, "enough of each to rank"
    assert set(stab["importances"]) == {"lr", "tag"}
    assert sum(stab["importances"].values()) == pytest.approx(1.0)
    assert max(stab["importances"], key=stab["importances"].get) == "lr"  # lr alone decides
    qual = imp["targets"]["quality"]
    assert qual["metric"] == "val_loss" and qual["trials"] == ok
    if ok >= MIN_TRIALS:
        assert set(qual["importances"]) == {"lr", "tag"}
    else:
        assert "too few" in qual["note"]
    page = write_report(tagged_run, "linreg", ["val_loss", "instability"]).read_text()
    panel = page[page.index("id=importance"):page.index("id=curves")]
    assert "PED-ANOVA" in panel and "<td class=t>lr</td>" in panel
    assert "<td class=t>tag</td>" in panel


@pytest.mark.slow
def test_barely_tried_choices_are_warned_about(tagged_run: Path) -> None:
    search = read_results_csv(tagged_run / "trials.csv").query("role == 'search'")
    counts = search["tag"].value_counts()
    few = {t: int(counts.get(t, 0)) for t in TAGS if counts.get(t, 0) < 3}
    assert few, "12 trials over 6 choices leave one below 3"
    warned = {u["choice"]: u for u in summary(tagged_run)["importance"]["under_explored"]
              if u.get("knob") == "tag"}
    assert {t: w["trials"] for t, w in warned.items()} == few
    tag, n = next(iter(few.items()))
    said = "never ran" if not n else f"ran in {n} of {len(search)} trials"
    assert warned[tag]["text"] == f"tag={tag} {said}; the sweep says little about it"
    page = (tagged_run / "report.html").read_text()
    assert f"tag={tag} {said}" in page


@pytest.mark.slow
def test_no_journal_or_a_garbled_one_leaves_one_line(tagged_run: Path, tmp_path: Path) -> None:
    old = make_sweep(tmp_path / "old")  # a folder from before the journal was kept
    page = write_report(old, "old", ["val_loss", "instability"]).read_text()
    assert "No importance panel: no optuna.journal in this folder" in page
    assert summary(old)["importance"]["targets"] == {}
    # under-explored choices come from trials.csv: grad_clip's three choices all ran enough
    assert summary(old)["importance"]["under_explored"] == []
    copy = tmp_path / "garbled"
    shutil.copytree(tagged_run, copy)
    journal = copy / "optuna.journal"
    journal.write_bytes(b'{"op_code": 0, "worker_id": "x"}\nnot json\n' + journal.read_bytes())
    page = write_report(copy, "linreg", ["val_loss", "instability"]).read_text()
    assert page.count("No importance panel: cannot read optuna.journal") == 1
    assert "id=trials" in page


def _study(folder: Path, outcomes: list[tuple[float, str, float]]) -> optuna.Study:
    """A journal study as a sweep leaves it: (lr, status, val_loss) per trial, a categorical
    ``opt`` knob and a knob the sweep held at one value."""
    folder.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(folder / "optuna.journal")))
    study = optuna.create_study(study_name="s", storage=storage,
                                directions=["minimize", "minimize"])
    dists = {"lr": optuna.distributions.FloatDistribution(1e-5, 1.0, log=True),
             "opt": optuna.distributions.CategoricalDistribution(["adam", "sgd"]),
             "held": optuna.distributions.CategoricalDistribution([1, 2])}
    for i, (lr, status, loss) in enumerate(outcomes):
        bad = status in ("unstable", "crash")
        trial = optuna.trial.create_trial(
            params={"lr": lr, "opt": ["adam", "sgd"][i % 2], "held": 1}, distributions=dists,
            values=[loss + 10 * bad, float(bad)], user_attrs={"status": status},
            system_attrs={"constraints:stability": float(bad)})
        study.add_trial(trial)
    return study


def test_quality_ranks_a_log_knob_and_leaves_out_one_held_fixed(tmp_path: Path) -> None:
    lrs = [10 ** (-5 + 0.4 * i) for i in range(12)]
    study = _study(tmp_path, [(lr, "unstable" if lr > 0.05 else "ok", abs(lr - 1e-2))
                              for lr in lrs])
    found = quality(study, "val_loss")
    assert set(found["importances"]) == {"lr", "opt"}  # held never varied
    assert found["importances"]["lr"] > found["importances"]["opt"]
    assert stability(study)["unstable"] == 2
    assert open_study(tmp_path, "other")[0].study_name == "s"  # the only study there


def test_a_config_proved_fragile_counts_once_as_unstable(tmp_path: Path) -> None:
    """The study holds a fragile config twice: its search trial (told ok) and the
    infeasible trial the race added at the same point (``race_of``)."""
    study = _study(tmp_path, [(10 ** (-5 + 0.4 * i), "ok", 0.1) for i in range(4)])
    first = study.get_trials()[2]
    study.add_trial(optuna.trial.create_trial(
        params=first.params, distributions=first.distributions, values=[10.0, 1.0],
        user_attrs={"status": "fragile", "race_of": first.number},
        system_attrs={"constraints:stability": 1.0}))
    found = stability(study)
    assert (found["trials"], found["stable"], found["unstable"]) == (4, 3, 1)
    assert found["fragile"] == 1  # the report says so beside the count


def test_all_ok_and_too_few_say_why(tmp_path: Path) -> None:
    all_ok = _study(tmp_path / "all_ok", [(10 ** (-5 + 0.4 * i), "ok", 0.1 * i) for i in range(10)])
    assert stability(all_ok)["note"] == "no trial was unstable: nothing sets stable trials " \
        "apart"
    assert stability(all_ok)["importances"] == {}
    few = _study(tmp_path / "few", [(1e-3, "ok", 0.1), (0.5, "unstable", 1.0), (1e-2, "ok", 0.2)])
    assert quality(few, "val_loss")["note"] == \
        f"too few trials finished ok (2; needs {MIN_TRIALS})"
    assert stability(few)["note"].startswith("too few trials (2 stable, 1 unstable")
    lrs = [10 ** (-5 + 0.4 * i) for i in range(12)]  # 10 stable, 2 unstable: no ranking
    two = _study(tmp_path / "two", [(lr, "unstable" if lr > 0.05 else "ok", 0.1) for lr in lrs])
    assert stability(two)["importances"] == {}
    assert stability(two)["note"].startswith("too few trials (10 stable, 2 unstable")


def test_categorical_counts_match_across_spellings() -> None:
    import pandas as pd

    search = pd.DataFrame({"clip": [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0],
                           "flag": [True] * 6 + [False]})
    space = {"clip": {"type": "categorical", "choices": [0, 1, 5]},
             "flag": {"type": "categorical", "choices": [True, False]}}
    found = {(u["knob"], u["choice"]): u["trials"] for u in under_explored(search, space)}
    assert found == {("clip", 5): 1, ("flag", False): 1}
