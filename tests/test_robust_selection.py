"""Robust selection: what ``sweeps best`` hands over holds on seeds it was not found on.

The linreg trainer with ``fragile_above: 0.1``: an LR above 0.1 is the best config on
the search seed (0) and settles in a bad basin (val_loss ~0.5 instead of ~0.005) on
seeds 1 and 2, smooth and finite, so no rule can fire. Below 0.1 every seed agrees.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from sweeps.commands.cli import main
from sweeps.results.confirm import Confirmation, SeedRun
from sweeps.results.export import worse_than_base
from sweeps.spec.loader import Objective
from tests.conftest import edit_linreg, read_results_csv, run_cli_in

EDGE = 0.1
FRAGILE_LRS = [0.3, 0.2, 0.15]
ROBUST_LRS = [0.08, 0.05, 0.03]


def _conf(planned: int, runs: list[SeedRun], tolerance: float = 0.2) -> Confirmation:
    return Confirmation("t", Objective(metric="val_loss"), tolerance, planned,
                        search=SeedRun(0, "ok", None, None, 1.0), runs=runs)


def test_no_recorded_confirmation_is_not_confirmed():
    assert _conf(2, []).verdict == "incomplete"
    assert not _conf(2, []).confirmed and not _conf(2, []).holds
    assert "0 of 2" in _conf(2, []).fragile_reason
    one = _conf(2, [SeedRun(1, "ok", None, None, 1.05)])
    assert one.verdict == "incomplete" and "1 of 2" in one.fragile_reason


def test_no_seeds_planned_is_unconfirmed_never_confirmed():
    conf = _conf(0, [])
    assert conf.verdict == "unconfirmed" and not conf.confirmed and conf.holds


def test_quality_gap_beyond_the_tolerance_is_fragile_and_says_which_seed():
    conf = _conf(2, [SeedRun(1, "ok", None, None, 1.1), SeedRun(2, "ok", None, None, 5.0)])
    assert conf.verdict == "fragile"
    assert "seed 2: val_loss 5 against seed 0's 1, 400% worse" in conf.fragile_reason
    assert math.isclose(conf.mean, 3.05) and conf.worst == 5.0
    held = _conf(2, [SeedRun(1, "ok", None, None, 1.1), SeedRun(2, "ok", None, None, 0.95)])
    assert held.verdict == "confirmed" and math.isclose(held.spread, 0.15 / 0.95)


def test_with_a_baseline_the_gap_is_a_share_of_the_improvement_over_it():
    # 0.0037 vs 0.0049: 32 % apart, but both within 0.2 % of each other's gain over 1.0
    near_zero = _conf(2, [SeedRun(1, "ok", None, None, 0.0049),
                          SeedRun(2, "ok", None, None, 0.0041)])
    near_zero.search = SeedRun(0, "ok", None, None, 0.0037)
    assert near_zero.verdict == "fragile", "relative to |best| without a baseline"
    near_zero.baseline = 1.0
    assert near_zero.verdict == "confirmed" and near_zero.spread < 0.01
    lost = _conf(2, [SeedRun(1, "ok", None, None, 0.674), SeedRun(2, "ok", None, None, 0.66)])
    lost.search, lost.baseline = SeedRun(0, "ok", None, None, 0.132), 1.5708
    assert lost.verdict == "fragile"
    assert "of its improvement over the random guess" in lost.fragile_reason


def test_a_top_config_worse_than_the_base_config_is_called_out():
    from sweeps.results.confirm import BaseReference, Selection

    top = _conf(2, [SeedRun(1, "ok", None, None, 1.0), SeedRun(2, "ok", None, None, 1.1)])
    base = BaseReference({}, Objective(metric="val_loss"), [
        SeedRun(0, "ok", None, None, 0.9), SeedRun(1, "ok", None, None, 0.9),
        SeedRun(2, "ok", None, None, 0.95)])
    assert "WORSE than your base config" in Selection([top], base).base_warning()
    base.runs[1].quality = base.runs[2].quality = 1.2
    assert Selection([top], base).base_warning() is None


def test_an_unstable_seed_is_fragile_and_an_unstable_probe_a_narrow_margin():
    bad = _conf(2, [SeedRun(1, "ok", None, None, 1.0), SeedRun(2, "unstable", "non_finite",
                                                                 20, None)])
    assert bad.verdict == "fragile" and "seed 2: non_finite @ 20" in bad.fragile_reason
    probe = _conf(1, [SeedRun(1, "ok", None, None, 1.0)])
    probe.probe_planned, probe.probe = True, SeedRun(0, "unstable", "divergence", 40, None)
    assert probe.verdict == "confirmed" and probe.margin == "narrow (divergence @ 40)"
    probe.require_margin = True  # confirm.require_margin: the probe is a veto
    assert probe.verdict == "fragile" and "LR probe unstable: divergence @ 40" in \
        probe.fragile_reason


def test_rank_is_by_fresh_seed_mean_not_the_search_seed():
    lucky = _conf(2, [SeedRun(1, "ok", None, None, 1.15), SeedRun(2, "ok", None, None, 1.18)])
    steady = _conf(2, [SeedRun(1, "ok", None, None, 1.08), SeedRun(2, "ok", None, None, 1.1)])
    steady.search = SeedRun(0, "ok", None, None, 1.09)  # worse on the search seed
    assert sorted([lucky, steady], key=Confirmation.rank_key) == [steady, lucky]


@pytest.fixture(scope="module")
def fragile_run(tmp_path_factory, ray_session):
    from tests.conftest import copy_sweepfiles

    folder = copy_sweepfiles(tmp_path_factory.mktemp("fragile"))
    edit_linreg(folder, name="fragile",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.5}},
                initial_points=[{"lr": lr} for lr in FRAGILE_LRS + ROBUST_LRS],
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"trials": 6, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 2, "lr_probe": 2.0, "keep": 2, "max_candidates": 6},
                train={"fragile_above": EDGE, "lr": 0.02})  # a modest base config
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet") == 0
    return folder / "results" / "fragile"


@pytest.mark.slow
def test_a_fragile_best_is_never_handed_over(fragile_run, capsys):
    trials = read_results_csv(fragile_run / "trials.csv")
    search = trials[trials["role"] == "search"]
    assert (search["status"] == "ok").all(), "no rule fires in the bad basin"
    best_search = search.sort_values("objective_val_loss").iloc[0]
    assert best_search["lr"] > EDGE, "the search seed's best is a fragile config"

    pareto = read_results_csv(fragile_run / "pareto.csv")
    fragile = pareto[pareto["lr"] > EDGE]
    assert len(fragile) and (fragile["selection"] == "fragile").all()
    assert fragile["selection_reason"].str.contains("against seed 0's").all()
    assert fragile["yaml"].isna().all()
    held = pareto[pareto["selection"] == "confirmed"]
    assert len(held) == 2, "confirmation went down the list until confirm.keep held"
    assert (held["lr"] < EDGE).all()
    assert list(held["rank"]) == [1, 2]
    assert held["val_loss_mean"].is_monotonic_increasing, "ranked by fresh-seed mean"
    for col in ("val_loss@seed0", "val_loss@seed1"):
        assert pareto[col].notna().all()
    assert held["val_loss@seed2"].notna().all()
    # raced: the first fresh seed already showed the gap, so a fragile candidate ran
    # nothing more (no second seed, no LR probe)
    assert fragile["val_loss@seed2"].isna().all()
    assert fragile["selection_reason"].str.contains("settled by 1 of 3 confirmation runs").all()
    reruns = trials[trials["role"].str.startswith(("confirm:", "probe:"))]
    per_candidate = reruns["role"].str.split(":").str[1].value_counts()
    assert (per_candidate[fragile["trial_id"]] == 1).all()
    assert (per_candidate[held["trial_id"]] == 3).all()
    row = trials[trials["trial_id"] == held.iloc[0]["trial_id"]].iloc[0]
    assert row["selection"] == "confirmed" and row["val_loss@seed1"] > 0

    assert main(["best", str(fragile_run)]) == 0
    best = capsys.readouterr().out.strip()
    cfg = yaml.safe_load(open(best))
    assert cfg["train"]["lr"] < EDGE
    header = [line for line in open(best) if line.startswith("#")]
    assert any("val_loss by seed: 0 (search):" in line for line in header)
    assert any("confirmation: stable on 2/2 extra seeds" in line for line in header)
    assert any("; margin wide" in line or "; margin narrow" in line for line in header)
    assert set(held["lr_margin"]) <= {"wide"} | {m for m in held["lr_margin"]
                                                 if str(m).startswith("narrow (")}
    assert worse_than_base(Path(best)) is None, "better than the base config"

    # what `sweeps best` handed over holds on seeds it has never seen
    from sweeps.spec.trainer_loader import load_trainer

    train = load_trainer("linreg_trainer:train", [str(fragile_run.parent.parent)])
    own = float(held.iloc[0]["val_loss@seed0"])
    for seed in (4, 5, 7):
        history: list[dict] = []
        train({**cfg, "sweep": {"seed": seed, "max_steps": 20}},
                             history.append)
        assert history[-1]["val_loss"] < own * 1.2, f"fresh seed {seed}"


@pytest.mark.slow
def test_report_shows_every_seed_and_why_a_candidate_was_fragile(fragile_run, capsys):
    import json

    assert main(["report", str(fragile_run), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["selection"]["confirmed"] == 2 and info["selection"]["fragile"] >= 1
    # fragile: a fresh seed's gap; poor: the modest base config, which held but trails
    assert all("against seed 0's" in why for why in info["fragile"].values())
    assert len(info["fragile"]) == info["selection"]["fragile"], "fragile ones only"
    assert all("against seed 0's" in n["reason"] or "behind the best confirmed config's" in
               n["reason"] for n in info["not_handed_over"].values())
    assert {n["verdict"] for n in info["not_handed_over"].values()} <= \
        {"fragile", "poor", "incomplete"}
    assert info["base"]["by_seed"], "the base config ran on the same seeds"
    base_id = info["base"]["trial_id"]
    if base_id in info["not_handed_over"]:  # the modest base config, named as such
        assert f"<b>{base_id}</b> (your base config)" in \
            (fragile_run / "report.html").read_text()
    page = (fragile_run / "report.html").read_text()
    assert "seeds.png" in page and "Candidates on fresh seeds" in page
    assert (fragile_run / "seeds.png").stat().st_size > 1000


def test_a_step_budget_keeps_nothing_back(linreg_dir):
    from sweeps.spec.loader import load_sweep

    edit_linreg(linreg_dir, budget={"total_steps": 3000, "max_steps": 60},
                confirm={"seeds": 2, "lr_probe": 2.0, "keep": 3})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert sweep.search_steps == 3000, "the race shares the whole budget with the search"


@pytest.mark.slow
def test_with_a_step_budget_the_race_settles_the_best_config_inside_it(linreg_dir, ray_session,
                                                                       capsys):
    """A step budget of 12 runs, the fragile region first in line: the race drops each
    fragile config on its first fresh seed while the search goes on, the base config and
    a robust config settle inside the budget, and the robust one, better than the base
    config on the same fresh seeds, is handed over."""
    edit_linreg(linreg_dir, name="fragile-budget",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.5}},
                initial_points=[{"lr": lr} for lr in FRAGILE_LRS + ROBUST_LRS],
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"max_steps": 20, "total_steps": 240, "concurrent": 2,
                        "scheduler": "none"},
                confirm={"seeds": 2, "lr_probe": 2.0, "keep": 1},
                train={"fragile_above": EDGE, "lr": 0.02})
    import yaml as _yaml

    data = _yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    del data["budget"]["trials"]
    (linreg_dir / "linreg.yaml").write_text(_yaml.safe_dump(data))
    assert run_cli_in(linreg_dir, "run", "linreg.yaml") == 0
    out = linreg_dir / "results" / "fragile-budget"
    trials = read_results_csv(out / "trials.csv")
    assert trials["steps"].sum() <= 240 + 2 * 20, "the race stayed inside the budget"
    search = trials[trials["role"] == "search"]
    assert (search["lr"] == 0.02).sum() == 1, "the base config is a search trial"
    reruns = trials[trials["role"].str.startswith(("confirm:", "probe:"))]
    owners = reruns["role"].str.split(":").str[1]
    fragile_ids = set(search[search["lr"] > EDGE]["trial_id"])
    assert fragile_ids & set(owners), "fragile configs raced during the search"
    assert (owners[owners.isin(fragile_ids)].value_counts() == 1).all(), \
        "one fresh seed dropped each fragile config"
    pareto = read_results_csv(out / "pareto.csv")
    assert (pareto[pareto["lr"] > EDGE]["selection"] == "fragile").all()
    held = pareto[pareto["rank"] == 1].iloc[0]
    assert held["selection"] == "confirmed" and EDGE > held["lr"] > 0.02
    from sweeps.results.summary import summary

    base = summary(out)["base"]  # the base config's own search trial and its fresh seeds
    assert base["by_seed"] and held["val_loss_mean"] < base["mean"], "better than the base"
    assert "steps: search" in capsys.readouterr().out
    # the sampler learnt of each fragile config during the search: infeasible
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name="fragile-budget", storage=JournalStorage(
        JournalFileBackend(str(out / "optuna.journal"))))
    # the first trial the sampler was asked for (two start at once: which of them reports
    # first, and so comes first in trials.csv, is the machine's business)
    assert study.trials[0].params["lr"] == 0.02, "the base config is the first search trial"
    told = {t.user_attrs.get("ray_trial_id"): t for t in study.trials}
    for trial_id in fragile_ids & set(owners):
        assert told[trial_id].user_attrs["status"] == "fragile"
        assert told[trial_id].constraints == {"stability": 1.0}
    # and the race ran while the search went on: a search trial started after a re-run
    order = list(trials["trial_id"])
    first_rerun = min(order.index(t) for t in reruns["trial_id"])
    assert any(order.index(t) > first_rerun for t in search["trial_id"])


@pytest.mark.slow
def test_a_base_config_off_the_search_space_runs_on_the_fresh_seeds_within_the_budget(
        linreg_dir, ray_session):
    """The base config's lr lies below the search space, so it cannot be a search trial: it
    runs after the search on the fresh seeds only (the comparison is there), and the search
    leaves the steps those runs take, so the sweep ends inside its budget."""
    import yaml as _yaml

    edit_linreg(linreg_dir, name="base-off-space",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.5}},
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"max_steps": 20, "total_steps": 300, "concurrent": 2,
                        "scheduler": "none"},
                confirm={"seeds": 2, "lr_probe": 2.0, "keep": 1},
                train={"lr": 0.002})
    data = _yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    del data["budget"]["trials"]
    (linreg_dir / "linreg.yaml").write_text(_yaml.safe_dump(data))
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet") == 0
    out = linreg_dir / "results" / "base-off-space"
    trials = read_results_csv(out / "trials.csv")
    base = trials[trials["role"] == "base"]
    assert sorted(base["seed"]) == [1, 2] and (base["lr"] == 0.002).all()
    assert (trials[trials["role"] == "search"]["lr"] >= 0.01).all()
    assert trials["steps"].sum() <= 300 + 2 * 20, "the base config's runs were budgeted"
    from sweeps.results.summary import summary

    info = summary(out)["base"]
    assert set(info["by_seed"]) == {1, 2} and info["mean"] is not None
    held = read_results_csv(out / "pareto.csv").query("rank == 1").iloc[0]
    assert held["selection"] == "confirmed" and held["val_loss_mean"] < info["mean"]


@pytest.mark.slow
def test_an_exact_tie_hands_over_the_base_config_and_a_resume_keeps_the_order(
        linreg_dir, ray_session, capsys):
    """A knob the trainer never reads: every config trains the same, to the last digit.
    Nothing beat the base config, so it is rank 1, and a resume that runs nothing does
    not re-rank the tie (it changed what `sweeps best` printed)."""
    edit_linreg(linreg_dir, name="tied",
                search_space={"lr": 0.1, "owner": {"type": "categorical",
                                        "choices": ["someone", "b", "c", "d"]}},
                write_back={"owner": "notes.owner"},
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"trials": 4, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 1, "lr_probe": 0, "keep": 4})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--no-preflight") == 0
    assert "your base config held and nothing beat it" in capsys.readouterr().out
    out = linreg_dir / "results" / "tied"
    pareto = read_results_csv(out / "pareto.csv")
    assert pareto["val_loss_mean"].nunique() == 1 and len(pareto) >= 2, "an exact tie"
    first = pareto.sort_values("rank")["trial_id"].tolist()
    assert pareto.query("rank == 1").iloc[0]["owner"] == "someone"
    assert run_cli_in(linreg_dir, "resume", str(out), "--quiet") == 0
    again = read_results_csv(out / "pareto.csv").sort_values("rank")["trial_id"].tolist()
    assert again == first


@pytest.mark.slow
def test_a_base_config_off_the_search_space_that_beats_the_search_is_handed_over(
        linreg_dir, ray_session, capsys):
    """The base config's lr (0.3) lies above a search space of slow LRs: it ran on the
    fresh seeds only, held there, and beat every config the search found, so it is rank 1
    in stable/ (the base config itself) and what `sweeps best` prints, not a worse config
    with a warning."""
    edit_linreg(linreg_dir, name="base-wins",
                search_space={"lr": {"type": "loguniform", "low": 0.003, "high": 0.006}},
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"trials": 4, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 2, "lr_probe": 0, "keep": 2},
                train={"lr": 0.3})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml") == 0
    printed = capsys.readouterr().out
    out = linreg_dir / "results" / "base-wins"
    trials = read_results_csv(out / "trials.csv")
    base = trials[trials["role"] == "base"]
    assert sorted(base["seed"]) == [1, 2] and (base["lr"] == 0.3).all()
    assert (trials[trials["role"] == "search"]["lr"] <= 0.006).all()
    pareto = read_results_csv(out / "pareto.csv")
    top = pareto.query("rank == 1").iloc[0]
    assert top["trial_id"] in set(base["trial_id"]) and top["selection"] == "confirmed"
    others = pareto[pareto["trial_id"] != top["trial_id"]]
    assert (others["val_loss_mean"] > 2 * top["val_loss_mean"]).all(), "the base config won"
    assert "your base config held and nothing beat it" in printed
    assert "WORSE than your base config" not in printed

    capsys.readouterr()
    assert main(["best", str(out)]) == 0
    best = capsys.readouterr().out.strip()
    assert yaml.safe_load(open(best))["train"]["lr"] == 0.3
    header = "".join(line for line in open(best) if line.startswith("#"))
    assert "your base config's own values" in header and "(search)" not in header


@pytest.mark.slow
def test_configs_the_scheduler_pruned_are_confirmed_when_the_survivors_are_fragile(
        tmp_path_factory, ray_session, capsys):
    """ASHA keeps what is best on the (lucky) search seed: here every survivor is fragile
    and every config that holds was pruned. Confirmation goes on to the pruned ones, runs
    them to full length on fresh seeds, and hands over one that holds."""
    from tests.conftest import copy_sweepfiles

    folder = copy_sweepfiles(tmp_path_factory.mktemp("pruned"))
    edit_linreg(folder, name="pruned",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.5}},
                initial_points=[{"lr": lr} for lr in FRAGILE_LRS + ROBUST_LRS],
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"trials": 6, "max_steps": 40, "concurrent": 2, "scheduler": "asha"},
                confirm={"seeds": 2, "lr_probe": 0, "keep": 3, "max_candidates": 6,
                         "base": False},
                train={"fragile_above": EDGE, "lr": 0.02})
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet") == 0
    out = folder / "results" / "pruned"
    search = read_results_csv(out / "trials.csv").query("role == 'search'")
    assert (search.query("status == 'ok'")["lr"] > EDGE).all(), "the survivors are fragile"
    assert len(search.query("status == 'pruned'")), "ASHA cut some trials"
    pareto = read_results_csv(out / "pareto.csv")
    held = pareto[pareto["selection"] == "confirmed"]
    assert len(held) and (held["lr"] < EDGE).all()
    assert pareto[pareto["lr"] > EDGE]["yaml"].isna().all(), "no fragile-region config"
    # a config that is bad on every fresh seed is stable but not good: never handed over
    for _, row in pareto[pareto["selection"] == "poor"].iterrows():
        assert "behind the best confirmed config's" in row["selection_reason"]
        assert row["val_loss_mean"] > 10 * held["val_loss_mean"].min()
    first = search.set_index("trial_id").loc[held.iloc[0]["trial_id"]]
    assert first["status"] == "pruned", "the config handed over was one ASHA had cut"

    capsys.readouterr()
    assert main(["best", str(out)]) == 0
    best = capsys.readouterr().out.strip()
    header = "".join(line for line in open(best) if line.startswith("#"))
    assert "(search, pruned at step" in header and "not counted" in header
    from sweeps.spec.trainer_loader import load_trainer

    cfg = yaml.safe_load(open(best))
    train = load_trainer("linreg_trainer:train", [str(folder)])
    mean = float(held.iloc[0]["val_loss_mean"])
    for seed in (4, 5):  # it holds on seeds no part of the sweep used
        history: list[dict] = []
        train({**cfg, "sweep": {"seed": seed, "max_steps": 40}}, history.append)
        assert history[-1]["val_loss"] < mean * 1.5 + 0.01, f"fresh seed {seed}"


class _Offline:
    """Selection without Ray: a trial book whose runs ``loss(lr, seed)`` scores (a run at
    LR x probe is scored at the scaled LR), and ``run``, the runner that stands in for Ray
    Tune, adding a finished run to the book for each config it is given."""

    def __init__(self, linreg_dir, loss, *, budget: dict, confirm: dict, steps: int = 20):
        from sweeps.record.book import TrialBook
        from sweeps.spec.loader import load_sweep

        edit_linreg(linreg_dir, search_space={"lr": {"type": "loguniform", "low": 0.01,
                                                     "high": 0.5}},
                    objectives=[{"metric": "val_loss", "mode": "min"}],
                    budget={"max_steps": steps, "concurrent": 2, **budget}, confirm=confirm)
        self.sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir,
                                import_trainer=False)
        self.book = TrialBook(self.sweep)
        self.loss, self.steps = loss, steps
        self.stages: list[str] = []

    def add(self, trial_id: str, lr: float, seed: int = 0, role: str = "search",
            lr_scale: float = 1.0) -> None:
        from sweeps.record.book import TrialRecord

        loss = self.loss(lr * lr_scale, seed)
        self.book.trials[trial_id] = TrialRecord(
            trial_id=trial_id, values={"lr": lr}, seed=seed, role=role, lr_scale=lr_scale,
            history=[{"step": s, "val_loss": loss} for s in range(1, self.steps + 1)],
            status="ok", finished=True)

    def run(self, configs: list[dict], name: str) -> None:
        from sweeps.protocol import LR_SCALE_KEY, ROLE_KEY, SEED_KEY

        self.stages.append(name)
        for k, cfg in enumerate(configs):
            self.add(f"{name}-{k}", cfg["lr"], cfg[SEED_KEY], cfg[ROLE_KEY],
                     cfg.get(LR_SCALE_KEY) or 1.0)

    def select(self, ids: list[str]):
        from sweeps.results.confirm import select

        ordered = [self.book.trials[i] for i in ids]
        return select(self.sweep, self.book, ordered, ordered[:1], self.run)


def test_racing_spends_a_fragile_candidates_other_runs_on_the_next_candidates(linreg_dir):
    """Four fragile candidates lead the list and the fifth holds. Screening each on one
    fresh seed rejects a fragile one for one re-run instead of three (two seeds and the LR
    probe), so the same step budget reaches the fifth; full rounds would stop at the
    second. The runner stands in for Ray Tune: the logic under test is the scheduling."""

    def val_loss(lr: float, seed: int) -> float:  # the fragile region is lucky on seed 0
        if lr > EDGE:
            return 0.001 if seed == 0 else 0.5
        return 0.005 + 0.0001 * seed + 0.01 * abs(lr - 0.05)  # best at 0.05, not a tie

    offline = _Offline(linreg_dir, val_loss, budget={"total_steps": 320},
                       confirm={"seeds": 2, "lr_probe": 2.0, "keep": 1, "max_candidates": 8})
    assert offline.sweep.confirm_steps == 100  # 1 x (2 seeds + probe) + the base on 2 seeds
    lrs = [0.3, 0.25, 0.2, 0.15, 0.05, 0.03]
    for i, lr in enumerate(lrs):
        offline.add(f"s{i}", lr)
    chosen = offline.select([f"s{i}" for i in range(len(lrs))])

    held_ids = [c.trial_id for c in chosen.handed_over]
    assert held_ids[0] == "s4", "the fifth candidate holds"
    # beside it, only the base config's own values (off the search space: run on the
    # fresh seeds alone, a candidate like any, apart from confirm.keep)
    assert [offline.book.trials[t].role for t in held_ids[1:]] == ["base"]
    assert held_ids[1:] == [chosen.base_id]
    assert [c.verdict for c in chosen.fragile] == ["fragile"] * 4
    for c in chosen.fragile:
        assert len(c.runs) == 1 and c.probe is None, "one re-run settled it"
        assert "settled by 1 of 3 confirmation runs" in c.fragile_reason
    held = chosen.handed_over[0]
    assert len(held.runs) == 2 and held.probe is not None
    spent = sum(r.last_step for r in offline.book.trials.values())
    assert spent <= 320, "inside budget.total_steps"
    assert offline.stages[0] == "confirm" and len(set(offline.stages)) == len(offline.stages)


def test_configs_behind_the_base_config_are_not_handed_over_nor_chased(linreg_dir):
    """The search's best config beats the base config's own values on the fresh seeds; the
    next ones hold but trail them. Those are ``poor`` (stable/ keeps the best and the base
    config), and they count towards ``confirm.keep``: the candidates after them (ranked
    lower still) are not re-run to fill stable/. The runner stands in for Ray Tune."""
    search_value = {0.3: 0.10, 0.1: 0.20, 0.2: 0.15, 0.25: 0.16, 0.05: 0.17, 0.04: 0.18}
    fresh_value = {0.3: 0.10, 0.1: 0.20, 0.2: 0.21, 0.25: 0.22, 0.05: 0.23, 0.04: 0.24}
    offline = _Offline(linreg_dir,
                       lambda lr, seed: (search_value if seed == 0 else fresh_value)[lr],
                       budget={"trials": 8},
                       confirm={"seeds": 2, "lr_probe": 0, "keep": 3, "max_candidates": 8})
    offline.add("base", 0.1)  # the base config's own lr, the search's first trial
    for i, lr in enumerate([0.3, 0.2, 0.25, 0.05, 0.04]):
        offline.add(f"s{i}", lr)
    chosen = offline.select([f"s{i}" for i in range(5)])

    book = offline.book
    assert all(r.lr_scale == 1.0 for r in book.trials.values()), "no LR probe"
    assert [c.trial_id for c in chosen.handed_over] == ["s0", "base"]
    poor = {c.trial_id: c for c in chosen.candidates if c.verdict == "poor"}
    assert set(poor) == {"s1", "s2"}
    assert "worse than the base config's 0.2" in poor["s1"].fragile_reason
    rerun = {r.role for r in book.trials.values() if r.role != "search"}
    assert rerun == {"confirm:s0", "confirm:s1", "confirm:s2", "confirm:base"}, \
        "s3 and s4, behind s1 and s2 in the search, were not re-run"


def test_the_quality_objective_has_its_own_random_guess_value(linreg_dir):
    """A quality metric on another scale than the training loss (a mean angle beside an
    NLL) gives its own baseline; the gaps confirmation measures use it."""
    from sweeps.spec.loader import load_sweep

    edit_linreg(linreg_dir, rules={"baseline_loss": 2.531},
                objectives=[{"metric": "val_loss", "mode": "min", "baseline": 1.5708},
                            {"metric": "instability", "mode": "min"}])
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert sweep.quality_baseline == 1.5708
    edit_linreg(linreg_dir, objectives=[{"metric": "val_loss", "mode": "min"}])
    assert load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir,
                      import_trainer=False).quality_baseline == 2.531
    # worst seed 0.45 against 0.20: 20 % of the improvement over pi/2 (just within the
    # tolerance), but only 11 % of the improvement over the NLL's 2.531
    runs = [SeedRun(1, "ok", None, None, 0.4744)]
    angle = Confirmation("t", Objective(metric="val_loss"), 0.2, 1,
                         search=SeedRun(0, "ok", None, None, 0.2), runs=runs, baseline=1.5708)
    assert angle.spread == pytest.approx(0.2, abs=1e-3)
    runs = [SeedRun(1, "ok", None, None, 0.5)]
    angle.runs = runs
    assert angle.verdict == "fragile"
    nll = Confirmation("t", Objective(metric="val_loss"), 0.2, 1,
                       search=SeedRun(0, "ok", None, None, 0.2), runs=runs, baseline=2.531)
    assert nll.verdict == "confirmed"


@pytest.mark.slow
def test_resume_with_a_larger_step_budget_settles_what_the_budget_left(linreg_dir,
                                                                       ray_session, capsys):
    """A step budget that settles one config leaves the next ones unsettled; `sweeps resume
    DIR --total-steps N` raises it and settles them, running no search trial again. A total
    that adds nothing is refused (exit 2) and changes nothing."""
    import yaml as _yaml

    edit_linreg(linreg_dir, name="more-steps",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.5}},
                initial_points=[{"lr": lr} for lr in ROBUST_LRS],
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"max_steps": 20, "total_steps": 160, "concurrent": 2,
                        "scheduler": "none"},
                confirm={"seeds": 2, "lr_probe": 2.0, "keep": 3, "base": False})
    data = _yaml.safe_load((linreg_dir / "linreg.yaml").read_text())
    del data["budget"]["trials"]
    (linreg_dir / "linreg.yaml").write_text(_yaml.safe_dump(data))
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet") == 0
    out = linreg_dir / "results" / "more-steps"
    before = read_results_csv(out / "trials.csv")
    held = read_results_csv(out / "pareto.csv").query("selection == 'confirmed'")
    assert 1 <= len(held) < 3, "the budget settled fewer than confirm.keep"
    saved = (out / "sweep.yaml").read_text()
    capsys.readouterr()
    assert main(["resume", str(out), "--quiet", "--total-steps", "100"]) == 2
    assert "--total-steps" in capsys.readouterr().err
    assert (out / "sweep.yaml").read_text() == saved, "a refused resume changes nothing"

    # the note's own command settles the candidate it names, twice in a row: the second
    # resume's round is a Ray Tune experiment of the name the first one's took
    import re

    for _ in range(2):
        note = (out / "selection_notes.txt").read_text()
        named, total = re.search(r"the next candidate, (\w+), needs \d+ more: `sweeps "
                                 r"resume \S+ --total-steps (\d+)`", note).groups()
        ran = read_results_csv(out / "trials.csv")["role"].str.endswith(f":{named}").sum()
        assert main(["resume", str(out), "--quiet", "--total-steps", total]) == 0
        settled = read_results_csv(out / "trials.csv")
        assert settled["role"].str.endswith(f":{named}").sum() > ran, f"{named} ran nothing"
    assert main(["resume", str(out), "--quiet", "--total-steps", "600"]) == 0
    after = read_results_csv(out / "trials.csv")
    search_before = set(before.query("role == 'search'")["trial_id"])
    assert set(after.query("role == 'search'")["trial_id"]) == search_before, \
        "no search trial ran again"
    assert len(after) > len(before), "more re-runs settled more candidates"
    assert len(read_results_csv(out / "pareto.csv").query("selection == 'confirmed'")) \
        > len(held)
    assert _yaml.safe_load((out / "sweep.yaml").read_text())["budget"]["total_steps"] == 600


def test_the_lr_probe_holds_once_the_rules_could_tell(linreg_dir, ray_session):
    """A probe asks only whether the candidate is stable at LR × 2: it ends ``ok`` at its
    hold step (half of max_steps here, past every window), its fresh seeds run their
    full length, and the margin is wide."""
    edit_linreg(linreg_dir, name="probe-hold",
                search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 0.05}},
                initial_points=[{"lr": 0.03}],
                objectives=[{"metric": "val_loss", "mode": "min"}],
                budget={"trials": 1, "max_steps": 100, "concurrent": 2, "scheduler": "none"},
                confirm={"seeds": 1, "lr_probe": 2.0, "keep": 1, "base": False})
    assert run_cli_in(linreg_dir, "run", "linreg.yaml", "--quiet") == 0
    out = linreg_dir / "results" / "probe-hold"
    trials = read_results_csv(out / "trials.csv")
    probe = trials[trials["role"].str.startswith("probe:")]
    fresh = trials[trials["role"].str.startswith("confirm:")]
    assert list(probe["status"]) == ["ok"] and list(probe["steps"]) == [50]
    assert list(fresh["status"]) == ["ok"] and list(fresh["steps"]) == [100]
    pareto = read_results_csv(out / "pareto.csv")
    assert pareto.iloc[0]["selection"] == "confirmed" and pareto.iloc[0]["lr_margin"] == "wide"


def test_a_racer_screened_during_the_search_and_then_not_settled_is_listed(linreg_dir):
    """Two racers ran their screen (the first fresh seed) during the search; with
    ``confirm.keep: 1`` the leader is settled and the other's race stops. It is still a
    candidate the race judged: listed ``incomplete`` with its seed and why the rest of its
    ladder did not run, not left out of pareto.csv."""
    offline = _Offline(linreg_dir, lambda lr, seed: 0.01 + abs(lr - 0.05) + 0.001 * seed,
                       budget={"trials": 8},
                       confirm={"seeds": 2, "lr_probe": 0, "keep": 1, "max_candidates": 8})
    # none at the base config's own lr (0.1): the base config is settled whatever keep says
    for trial_id, lr in (("s0", 0.05), ("s1", 0.2), ("s2", 0.3)):
        offline.add(trial_id, lr)
    for trial_id, lr in (("s0", 0.05), ("s1", 0.2)):  # the race's screens
        offline.add(f"screen-{trial_id}", lr, seed=1, role=f"confirm:{trial_id}")
    chosen = offline.select(["s0", "s1", "s2"])

    assert [c.trial_id for c in chosen.handed_over][:1] == ["s0"]
    left = {c.trial_id: c for c in chosen.candidates if c.verdict == "incomplete"}
    assert set(left) == {"s1"}, "s2 never raced: no candidate row"
    assert [r.seed for r in left["s1"].runs] == [1]
    assert left["s1"].fragile_reason.startswith(
        "not settled: confirm.keep is 1, and 1 candidate(s) ranked ahead of it")
    assert "1 of 2 confirmation runs recorded" in left["s1"].fragile_reason
    assert not any(r.role == "confirm:s1" and r.seed == 2 for r in offline.book.trials.values())


@pytest.mark.slow
def test_a_round_named_like_one_an_earlier_run_finished_still_runs(linreg_dir, ray_session):
    """A resume with a larger budget numbers its rounds from ``confirm`` again; where the
    earlier run finished a round of that name, restoring it ran nothing, and a candidate
    whose screen was done (its round had only the probe and a seed) never ran: the note's
    own ``--total-steps`` left it unsettled. What the restored round did not run now
    runs under a name of its own."""
    from sweeps.protocol import LR_SCALE_KEY, ROLE_KEY, SEED_KEY
    from sweeps.record.book import books_of, open_book
    from sweeps.spec.loader import load_sweep
    from sweeps.tune.experiments import run_configs

    edit_linreg(linreg_dir, budget={"trials": 1, "max_steps": 10, "concurrent": 2,
                                    "scheduler": "none"})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    sweep.output_dir.mkdir(parents=True)

    def run(of: str) -> dict:
        return {"lr": 0.05, SEED_KEY: 1, ROLE_KEY: f"confirm:{of}", LR_SCALE_KEY: None}

    with books_of(sweep):
        book = open_book(sweep)
        run_configs(sweep, book, [run("first")], "confirm", progress=False)
        run_configs(sweep, book, [run("first"), run("later")], "confirm", progress=False,
                    resume=True)
    roles = sorted(rec.role for rec in book.trials.values())
    assert roles == ["confirm:first", "confirm:later"], "each ran once"
    assert (sweep.output_dir / "confirm-resumed").is_dir()


def test_a_lead_over_the_base_config_inside_the_seed_spread_is_said():
    """Rank 1 led the base config by 0.0013 on two fresh seeds that varied by ~0.007, and
    nothing said the two were not told apart; a lead wider than the spread says nothing."""
    from sweeps.results.confirm import BaseReference, Selection

    def selection(top: list[float], base: list[float]) -> Selection:
        runs = [SeedRun(s + 1, "ok", None, None, v) for s, v in enumerate(top)]
        conf = Confirmation("top", Objective(metric="val_loss"), 0.5, len(runs),
                            search=SeedRun(0, "ok", None, None, top[0]), runs=runs)
        ref = BaseReference({"lr": 0.05}, Objective(metric="val_loss"), search_seed=0,
                            runs=[SeedRun(s + 1, "ok", None, None, v)
                                  for s, v in enumerate(base)])
        return Selection([conf], base=ref, base_id="base")

    tie = selection([0.5090, 0.5160], [0.5100, 0.5176]).base_tie()
    assert tie is not None and "leads your base config by 0.0013" in tie
    assert "less than the seeds vary (0.0076)" in tie
    assert selection([0.40, 0.41], [0.50, 0.51]).base_tie() is None
