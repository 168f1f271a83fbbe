"""Hydra users: a base config with a ``defaults:`` list is composed by Hydra itself, and every
handed-over config is also an override list that Hydra composes into the same config."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweeps.errors import SpecError
from sweeps.spec.hydra_config import overrides
from sweeps.spec.loader import load_sweep, load_sweep_dict
from tests.conftest import copy_sweepfiles, edit_linreg, run_cli_in


def _hydra_linreg(folder: Path) -> Path:
    """The linreg sweep with its base config split into a Hydra primary config and a
    config group ``train`` (option ``sgd``)."""
    copy_sweepfiles(folder)
    (folder / "conf" / "train").mkdir(parents=True)
    (folder / "conf" / "config.yaml").write_text(
        "defaults:\n  - train: sgd\n  - _self_\nexperiment: linreg\n"
        "notes:\n  lr_seen: ${train.lr}\n")
    (folder / "conf" / "train" / "sgd.yaml").write_text("lr: 0.1\nsteps: 60\nfail: none\n")
    edit_linreg(folder, base_config="conf/config.yaml")
    return folder


def _compose(conf: Path, argv: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(conf), version_base=None):
        return OmegaConf.to_container(compose("config", overrides=argv), resolve=False)


def test_a_hydra_base_config_is_composed_by_hydra(tmp_path: Path) -> None:
    folder = _hydra_linreg(tmp_path)
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert sweep.base_config["train"] == {"lr": 0.1, "steps": 60, "fail": "none"}
    assert sweep.base_config["notes"] == {"lr_seen": "${train.lr}"}, "interpolations kept"
    assert "defaults" not in sweep.base_config
    (folder / "conf" / "config.yaml").write_text("defaults:\n  - train: adam\n")
    with pytest.raises(SpecError) as caught:
        load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert caught.value.key == "base_config" and "Hydra could not compose" in str(caught.value)
    assert "(available options in 'train': " in str(caught.value), "Hydra's own list kept"


def test_override_lists_quote_what_hydra_would_misread() -> None:
    base = {"training": {"lr": 0.1, "compile": "none", "tag": "a"}}
    assert overrides(base, {"training.lr": 0.0031, "training.compile": "none",
                            "training.tag": "x y", "model.width": 64}) == [
        "training.lr=0.0031", "training.compile='none'", "training.tag='x y'",
        "+model.width=64"]


def _with_group_knob(folder: Path) -> Path:
    """The Hydra linreg sweep with a second option of the ``train`` group (``slow``: its
    own steps key and a tag) and a knob ``schedule`` that picks the option."""
    (folder / "conf" / "train" / "slow.yaml").write_text(
        "lr: 0.01\nsteps: 60\nfail: none\ntag: slow\n")
    edit_linreg(folder, search_space={
        "lr": {"type": "loguniform", "low": 1.0e-3, "high": 0.5},
        "schedule": {"type": "categorical", "choices": ["sgd", "slow"]}},
        write_back={"lr": "train.lr", "schedule": "train"})
    return folder


def test_a_key_given_twice_in_a_group_option_names_that_file_and_line(tmp_path: Path) -> None:
    """The message said only "while constructing a mapping", and its fix to list options
    that exist."""
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    (folder / "conf" / "train" / "slow.yaml").write_text(
        "lr: 0.01\nsteps: 60\nfail: none\nlr: 0.02\n")
    with pytest.raises(SpecError) as err:
        load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert err.value.key == "search_space.schedule.choices"
    assert f"{folder / 'conf' / 'train' / 'slow.yaml'}, line 4: found duplicate key" \
        in err.value.problem and "fix the YAML of that file" in err.value.fix


def test_a_knob_written_to_a_config_group_picks_its_option(tmp_path: Path) -> None:
    """``write_back: {schedule: train}``: ``train`` is a group of the defaults list, so the
    knob picks its option (the whole group changes, as ``train=slow`` on the command line)."""
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert sweep.groups is not None and sweep.groups.knobs == {"schedule": "train"}
    assert sweep.base_value("schedule") == "sgd", "the primary config's option"
    slow = sweep.trial_config({"lr": 0.2, "schedule": "slow"}, trial_id="t", seed=0)
    assert slow["train"] == {"lr": 0.2, "steps": 60, "fail": "none", "tag": "slow"}
    assert "tag" not in sweep.trial_config({"lr": 0.2, "schedule": "sgd"}, trial_id="t",
                                           seed=0)["train"]
    assert sweep.values_by_path({"lr": 0.2, "schedule": "slow"}) == {"train.lr": 0.2}
    again = load_sweep_dict(sweep.resolved(), base_dir=folder, workdir=folder,
                            import_trainer=False)  # as a results folder's sweep.yaml
    assert again.groups == sweep.groups, "kept in sweep.yaml: resume composes nothing"


@pytest.mark.parametrize(("entry", "key", "says"), [
    ({"type": "categorical", "choices": ["sgd", "fsat"]}, "search_space.schedule.choices",
     "available options in 'train': "),
    ({"type": "uniform", "low": 0.0, "high": 1.0}, "search_space.schedule",
     "choices: [sgd, slow]"),  # the group's real options, not a placeholder
])
def test_a_group_knob_that_cannot_compose_is_bad_input(tmp_path: Path, entry, key,
                                                       says) -> None:
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    edit_linreg(folder, search_space={"schedule": entry})
    with pytest.raises(SpecError) as caught:
        load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert caught.value.key == key and says in str(caught.value)


@pytest.mark.slow
def test_the_override_list_composes_into_the_handed_over_config(tmp_path, ray_session):
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    edit_linreg(folder, budget={"trials": 4, "max_steps": 30, "scheduler": "none"},
                confirm={"seeds": 0, "lr_probe": 0},
                initial_points=[{"lr": 0.1, "schedule": "slow"}])
    assert run_cli_in(folder, "run", "linreg.yaml", "--quiet", "--no-preflight") == 0
    stable = sorted((folder / "results" / "linreg" / "stable").glob("rank-*.yaml"))
    assert stable
    options = set()
    for path in stable:
        listed = path.with_suffix(".overrides").read_text().splitlines()
        assert listed[0].startswith("train=") and any(o.startswith("train.lr=")
                                                      for o in listed)
        options.add(listed[0])
        exported = yaml.safe_load(path.read_text())
        assert _compose(folder / "conf", listed) == exported
    trials = pd.read_csv(folder / "results" / "linreg" / "trials.csv")
    assert set(trials["schedule"]) == {"sgd", "slow"}, "both options ran"


def test_the_hydra_example_validates_and_its_entry_point_takes_overrides(tmp_path) -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / "hydra"
    sweep = load_sweep(example / "sweep.yaml", workdir=tmp_path, import_trainer=False)
    assert sweep.base_config["training"]["lr"] == 3.0e-3
    line = " ".join(overrides(sweep.base_config, sweep.values_by_path(
        {"lr": 0.002, "dropout": 0.05, "compile": "none"})))
    done = subprocess.run(
        [sys.executable, str(example / "train.py"), *line.split(), "training.max_steps=4",
         "training.eval_every=4", f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "regression-adam: val_loss" in done.stdout and "at step 4" in done.stdout


def test_a_key_only_some_group_options_have_is_bad_input(tmp_path: Path) -> None:
    """``train.tag`` is in train=slow and not in train=sgd: a trial of sgd would get it from
    nowhere (the closest-path hint pointed at another key, and new_keys added it)."""
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    edit_linreg(folder, search_space={"lr": {"type": "loguniform", "low": 1e-3, "high": 0.5},
                                      "schedule": {"type": "categorical",
                                                   "choices": ["sgd", "slow"]},
                                      "tag": {"type": "categorical", "choices": ["a", "b"]}},
                write_back={"lr": "train.lr", "schedule": "train", "tag": "train.tag"},
                new_keys=True)
    with pytest.raises(SpecError) as caught:
        load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert caught.value.key == "write_back.tag"
    assert "in the config composed with train=slow but not with train=sgd" in \
        caught.value.problem


def test_a_knob_written_inside_a_group_with_its_options_gets_a_note(tmp_path: Path) -> None:
    """``write_back: {schedule: train.fail}`` with choices [sgd, slow]: one string changes
    and the rest of the group stays; the note says how to switch the group."""
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    edit_linreg(folder, write_back={"lr": "train.lr", "schedule": "train.fail"})
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert sweep.groups is None
    assert any("a key inside the config group 'train'" in n and "write_back: {schedule: "
               "train}" in n for n in sweep.notes)


def test_a_group_knob_written_to_a_misspelt_group_is_pointed_at_the_group(
        tmp_path: Path) -> None:
    """``write_back: {schedule: trian}`` for choices [sgd, slow], the options of group
    ``train``: the fix offered the closest key by spelling, a float of another section."""
    folder = _with_group_knob(_hydra_linreg(tmp_path))
    edit_linreg(folder, write_back={"lr": "train.lr", "schedule": "schedule"})
    with pytest.raises(SpecError) as caught:
        load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert caught.value.key == "write_back.schedule"
    assert "options of the Hydra config group 'train'" in caught.value.problem
    assert caught.value.fix.startswith("write 'schedule: train'")


def test_try_with_a_group_option_set_takes_that_options_values(tmp_path: Path) -> None:
    """``sweeps try --set optim=sgd`` ran SGD with AdamW's lr and weight decay from the
    primary config; ``python app.py optim=sgd`` takes sgd.yaml's."""
    from sweeps.trial.tryout import try_values

    folder = _with_group_knob(_hydra_linreg(tmp_path))
    sweep = load_sweep(folder / "linreg.yaml", workdir=folder, import_trainer=False)
    assert try_values(sweep, {})["lr"] == 0.1, "the primary config's option, sgd"
    assert try_values(sweep, {"schedule": "slow"}) == {"lr": 0.01, "schedule": "slow"}
    assert try_values(sweep, {"schedule": "slow", "lr": 0.2})["lr"] == 0.2, "what is set wins"
    assert try_values(sweep, {"schedule": "slow", "train.lr": 0.2})["lr"] == 0.2
