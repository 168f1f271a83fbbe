"""A real sweep on Ray with a trainer whose unstable regions are known exactly.

Linear regression by SGD (tests/sweepfiles/linreg_trainer.py): LR above ~1
diverges, LR below ~1e-4 stays at the baseline loss 1.0 for the whole budget.
The checks read what a user would: trials.csv, the failure reasons, the YAML
files under stable/, the Optuna study and the MLflow runs.
"""

from __future__ import annotations

import math

import optuna
import pandas as pd
import pytest
import yaml

from sweeps.commands.cli import main
from sweeps.record.objectives import STEADY_INSTABILITY
from tests.conftest import copy_sweepfiles, edit_linreg, read_results_csv, run_cli_in

pytestmark = pytest.mark.slow

UNSTABLE_LRS = [20.0, 5.0]
FLAT_LRS = [1.0e-5]


def _journal(folder):
    """The study as a user opens it (README)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(folder / "optuna.journal")))


def _trials(folder):
    trials = read_results_csv(folder / "trials.csv")
    trials["reason"] = trials["reason"].fillna("")
    return trials


@pytest.fixture(scope="module")
def linreg_run(tmp_path_factory, ray_session):
    folder = copy_sweepfiles(tmp_path_factory.mktemp("linreg"))
    edit_linreg(folder, initial_points=[{"lr": lr} for lr in UNSTABLE_LRS + FLAT_LRS + [0.05]])
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet") == 0
    return folder / "results" / "linreg"


def test_unstable_trials_stopped_early_with_reasons(linreg_run):
    trials = _trials(linreg_run)
    search = trials[trials["role"] == "search"]
    assert len(search) == 12
    for lr in UNSTABLE_LRS:
        row = search[search["lr"].sub(lr).abs() < 1e-9].iloc[0]
        assert row["status"] == "unstable"
        assert row["reason"] in ("non_finite", "grad_blowup", "divergence")
        assert int(row["stop_step"]) < 20, "a blow-up must be caught within a few steps"
        assert int(row["steps"]) == int(row["stop_step"]), "no step after the verdict"
    row = search[search["lr"].sub(FLAT_LRS[0]).abs() < 1e-12].iloc[0]
    assert row["status"] == "unstable" and row["reason"] == "flat_at_baseline"
    assert int(row["stop_step"]) < 60
    healthy = search[(search["lr"] > 1e-2) & (search["lr"] < 0.5)]
    assert len(healthy) and (healthy["status"] == "ok").all()
    assert (healthy["objective_val_loss"] < 0.1).all()


def test_stable_yamls_are_stable_configs_in_the_user_layout(linreg_run):
    trials = _trials(linreg_run)
    files = sorted((linreg_run / "stable").glob("rank-*.yaml"))
    assert files, "at least one confirmed stable config"
    assert files[0].name.startswith("rank-01-")
    base = yaml.safe_load((linreg_run.parent.parent / "linreg_config.yaml").read_text())
    for f in files:
        text = f.read_text()
        assert text.startswith("# Written by sweeps")
        # one fresh seed (confirm.seeds: 1), or confirm.narrow_seeds (4) where the LR x2
        # probe failed: a narrow margin asks for more evidence
        seeds = 4 if "margin narrow" in text else 1
        assert f"confirmation: stable on {seeds}/{seeds} extra seeds" in text
        cfg = yaml.safe_load(text)
        assert list(cfg) == list(base), "top-level layout and order kept"
        assert cfg["notes"] == base["notes"] and cfg["experiment"] == base["experiment"]
        assert {k: v for k, v in cfg["train"].items() if k != "lr"} == \
            {k: v for k, v in base["train"].items() if k != "lr"}
        trial_id = f.stem.split("-", 2)[2]
        row = trials[trials["trial_id"] == trial_id].iloc[0]
        assert row["status"] == "ok" and math.isclose(cfg["train"]["lr"], row["lr"])
        assert 1e-4 < cfg["train"]["lr"] < 1.0
    pareto = pd.read_csv(linreg_run / "pareto.csv")
    assert pareto["confirmed"].all() == (len(files) == len(pareto))


def test_optuna_study_records_unstable_trials_as_infeasible(linreg_run):
    study = optuna.load_study(study_name="linreg",
                              storage=_journal(linreg_run))
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 12
    unstable = [t for t in trials if t.user_attrs.get("status") == "unstable"]
    ok = [t for t in trials if t.user_attrs.get("status") == "ok"]
    assert len(unstable) >= 3 and ok
    for t in unstable:
        assert t.state == optuna.trial.TrialState.COMPLETE, "told, not FAIL"
        assert t.constraints == {"stability": 1.0}
        assert t.user_attrs["reason"] in ("non_finite", "grad_blowup", "divergence",
                                          "flat_at_baseline", "loss_spike")
        assert all(math.isfinite(v) for v in t.values)
        assert t.values[0] >= max(o.values[0] for o in ok), "penalised below every ok trial"
        assert t.values[1] >= 10.0
    measured = _trials(linreg_run).set_index("trial_id")["objective_instability"]
    for t in ok:
        assert t.constraints == {"stability": 0.0}
        # a steady run's instability (under a 2x grad-norm jump) is told as that floor
        assert t.values[1] == pytest.approx(
            max(measured[t.user_attrs["ray_trial_id"]], STEADY_INSTABILITY))


def test_mlflow_has_a_run_per_trial_with_reason_tags(linreg_run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{linreg_run / 'mlflow.db'}")
    exp = client.get_experiment_by_name("linreg")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweeps.kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    trials = _trials(linreg_run)
    assert len(parents) == 1 and len(children) == len(trials)
    search = trials[trials["role"] == "search"]
    counted = {k: v for k, v in parents[0].data.metrics.items() if k.startswith("trials_")}
    assert sum(counted.values()) == len(search), "the outcome counts are of search trials"
    assert counted == {f"trials_{k}": float(v) for k, v in search["status"].value_counts().items()}
    reruns = trials[trials["role"] != "search"]
    kinds = reruns["role"].str.partition(":")[0].value_counts()
    for kind, n in kinds.items():  # confirm_runs, probe_runs, base_runs, as search.md says
        assert parents[0].data.metrics[f"{kind}_runs"] == n
    for run in children:
        tags = run.data.tags
        row = trials[trials["trial_id"] == run.info.run_name].iloc[0]
        assert tags["sweeps.status"] == row["status"]
        if row["reason"]:
            assert tags["sweeps.reason"] == row["reason"]
        assert "loss" in run.data.metrics


def test_crashing_trials_are_classified_and_the_sweep_goes_on(linreg_dir, ray_session,
                                                             monkeypatch):
    tmp_path = linreg_dir
    edit_linreg(tmp_path, name="linreg-crash",
                search_space={"fail": {"type": "categorical",
                                       "choices": ["none", "raise", "raise_late", "silent"]}},
                write_back={"fail": "train.fail"},
                initial_points=[{"lr": 0.05, "fail": f}
                                for f in ("raise", "raise_late", "silent", "none")],
                budget={"trials": 4, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    monkeypatch.chdir(tmp_path)
    assert main(["run", "linreg.yaml", "--quiet"]) == 0
    out = tmp_path / "results" / "linreg-crash"
    trials = _trials(out).set_index("fail")
    assert trials.loc["none", "status"] == "ok"
    for fail, step in (("raise", 0), ("raise_late", 4), ("silent", 0)):
        assert trials.loc[fail, "status"] == "crash"
        assert trials.loc[fail, "reason"] == "crash"
        assert trials.loc[fail, "stop_step"] == step
    assert "planted failure at step 5" in trials.loc["raise_late", "evidence"]
    assert "without calling report" in trials.loc["silent", "evidence"]
    errors = list((out / "trials").glob("*.error.txt"))
    assert len(errors) == 2 and all("Traceback" in e.read_text() for e in errors)
    only = f"rank-01-{trials.loc['none', 'trial_id']}"
    assert sorted(p.name for p in (out / "stable").iterdir()) == [
        f"{only}.overrides", f"{only}.yaml"]
    study = optuna.load_study(study_name="linreg-crash",
                              storage=_journal(out))
    crashed = [t for t in study.trials if t.user_attrs.get("status") == "crash"]
    assert len(crashed) == 3 and all(t.constraints == {"stability": 1.0} for t in crashed)


def test_a_config_stable_only_on_a_lucky_seed_does_not_reach_stable(linreg_dir, ray_session,
                                                                   monkeypatch, capsys):
    tmp_path = linreg_dir
    edit_linreg(tmp_path, name="lucky",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}},
                budget={"trials": 3, "max_steps": 40, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 2, "lr_probe": 2.0},
                train={"nan_on_seeds": [2]})  # search runs seed 0; confirmation seeds 1 and 2
    monkeypatch.chdir(tmp_path)
    assert main(["run", "linreg.yaml", "--quiet"]) == 0
    out = tmp_path / "results" / "lucky"
    pareto = pd.read_csv(out / "pareto.csv")
    assert len(pareto) >= 1
    assert (pareto["seeds_passed"] == 1).all() and (pareto["seeds_run"] == 2).all()
    assert (pareto["objectives_steps"] == 40).all(), "the search runs' own length"

    assert (~pareto["confirmed"]).all()
    assert pareto["seed_failures"].str.contains("seed 2: non_finite").all()
    assert not list((out / "stable").glob("*.yaml")), "no lucky-seed config is written"
    trials = _trials(out)
    assert (trials[trials["role"] == "search"]["status"] == "ok").all()
    assert "No stable config written: no candidate held on every fresh seed" in \
        capsys.readouterr().out


def test_a_sweep_where_every_trial_sat_at_the_guess_says_what_to_check(linreg_dir,
                                                                      ray_session, capsys):
    """Labels that carry no signal leave every trial at the random guess: nothing is
    handed over, and the summary says no trial ended ok and what to check, not that
    candidates failed fresh seeds none of them ran."""
    edit_linreg(linreg_dir, name="nothing-learnt",
                search_space={"lr": {"type": "loguniform", "low": 1e-7, "high": 1e-6}},
                budget={"trials": 2, "max_steps": 60, "concurrent": 2, "scheduler": "none"},
                train={"lr": 5e-7})  # the base config learns nothing either
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet") == 0
    trials = _trials(linreg_dir / "results" / "nothing-learnt")
    assert (trials[trials["role"] == "search"]["reason"] == "flat_at_baseline").all()
    out = capsys.readouterr().out
    assert "No stable config written: no search trial ended ok (2 flat_at_baseline); every " \
           "one sat at the random guess" in " ".join(out.split())
    assert "labels reach the loss" in " ".join(out.split())


def test_a_json_base_config_comes_back_as_json_the_users_script_reads(linreg_dir, ray_session,
                                                                      monkeypatch, capsys):
    import json

    tmp_path = linreg_dir
    config = yaml.safe_load((tmp_path / "linreg_config.yaml").read_text())
    (tmp_path / "linreg_config.json").write_text(json.dumps(config, indent=2))
    edit_linreg(tmp_path, name="json-base", base_config="linreg_config.json",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}},
                budget={"trials": 3, "max_steps": 40, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 1, "lr_probe": 0})
    monkeypatch.chdir(tmp_path)
    assert main(["run", "linreg.yaml", "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "results" / "json-base"
    assert main(["best", str(out)]) == 0
    best = capsys.readouterr().out.strip()
    assert best.endswith(".json") and "rank-01-" in best
    with open(best) as fh:  # what the user's `json.load(open(args.config))` does
        handed = json.load(fh)
    trial = best.rsplit("-", 1)[1].removesuffix(".json")
    row = _trials(out).set_index("trial_id").loc[trial]
    assert handed == {**config, "train": {**config["train"], "lr": row["lr"]}}
    header = (out / "stable" / f"rank-01-{trial}.header").read_text()
    assert "confirmation: stable on 1/1 extra seeds" in header
    assert pd.read_csv(out / "pareto.csv")["yaml"].iloc[0] == f"stable/rank-01-{trial}.json"
    assert main(["report", str(out)]) == 0  # the report reads the folder as it is


def test_report_best_and_machine_readable_output(linreg_run, capsys):
    import json

    assert main(["report", str(linreg_run), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    trials = _trials(linreg_run)
    search = trials[trials["role"] == "search"]
    assert info["search_trials"] == len(search)
    assert info["counts"] == search["status"].value_counts().to_dict()
    assert info["failures"] == search[search["reason"] != ""]["reason"].value_counts().to_dict()
    assert main(["report", str(linreg_run), "--format", "csv"]) == 0
    assert capsys.readouterr().out == (linreg_run / "trials.csv").read_text()
    assert main(["best", str(linreg_run)]) == 0
    best = capsys.readouterr().out.strip()
    assert best == info["best_yaml"] and best.endswith(".yaml") and "rank-01-" in best
    assert main(["report", str(linreg_run)]) == 0
    assert "report:" in capsys.readouterr().out
    assert (linreg_run / "report.html").stat().st_size > 1000


def test_search_on_quality_alone_keeps_the_constraint(linreg_dir, ray_session, monkeypatch):
    tmp_path = linreg_dir
    edit_linreg(tmp_path, name="quality-only",
                budget={"trials": 4, "max_steps": 40, "concurrent": 2, "scheduler": "none",
                        "search_on": "quality"},
                confirm={"seeds": 0, "lr_probe": 0},
                initial_points=[{"lr": 20.0}, {"lr": 0.05}])
    monkeypatch.chdir(tmp_path)
    assert main(["run", "linreg.yaml", "--quiet"]) == 0
    out = tmp_path / "results" / "quality-only"
    study = optuna.load_study(study_name="quality-only", storage=_journal(out))
    assert len(study.directions) == 1
    failed = [t for t in study.trials if t.user_attrs.get("status") == "unstable"]
    assert failed and all(t.constraints == {"stability": 1.0} for t in failed)
    pareto = pd.read_csv(out / "pareto.csv")
    assert {"val_loss", "instability"} <= set(pareto.columns), "selection uses every objective"


def test_end_of_run_summary_fits_80_columns_in_a_log_file(linreg_dir, ray_session, capsys,
                                                          monkeypatch):
    edit_linreg(linreg_dir, name="logfile",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.1},
                              "momentum": {"type": "uniform", "low": 0.0, "high": 0.5}},
                write_back={"lr": "train.lr", "momentum": "train.momentum"}, new_keys=True,
                budget={"trials": 3, "max_steps": 30, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 1, "lr_probe": 0, "keep": 1})
    monkeypatch.chdir(linreg_dir)
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight"]) == 0
    out = capsys.readouterr().out  # not a terminal: the compact summary
    assert "┃" not in out and "…" not in out, "no rich table squeezed into 80 columns"
    top = out[out.index("top search trials by val_loss"):out.index("search: ")]
    lines = top.splitlines()
    assert len(lines) >= 3 and all(len(line) <= 80 for line in lines)
    assert "lr=" in top and "momentum=" in top


RELATIVE_TRAINER = '''
from linreg_trainer import train as linreg_train


def train(config, report):
    with open("data/lr_scale.txt") as fh:  # a path relative to where sweeps was started
        scale = float(fh.read())
    config["train"]["lr"] = float(config["train"]["lr"]) * scale
    linreg_train(config, report)
'''


def test_trials_run_where_sweeps_was_started_and_all_crashed_is_an_error(linreg_dir,
                                                                         ray_session,
                                                                         monkeypatch, capsys):
    (linreg_dir / "relative_trainer.py").write_text(RELATIVE_TRAINER)
    (linreg_dir / "data").mkdir()
    (linreg_dir / "data" / "lr_scale.txt").write_text("1.0\n")
    edit_linreg(linreg_dir, name="relative", trainer="relative_trainer:train",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}},
                budget={"trials": 2, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0})
    monkeypatch.chdir(linreg_dir)
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight"]) == 0
    trials = _trials(linreg_dir / "results" / "relative")
    assert (trials["status"] == "ok").all(), "data/lr_scale.txt was found by every trial"

    (linreg_dir / "data" / "lr_scale.txt").unlink()  # now every trial raises
    assert main(["run", "linreg.yaml", "--quiet", "--no-preflight"]) == 1
    err = capsys.readouterr().err
    assert "every search trial crashed" in err and "FileNotFoundError" in err
    assert ".error.txt" in err
