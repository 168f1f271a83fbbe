"""Bad input: one clear message naming the key and the fix, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeps.commands.cli import main
from tests.conftest import edit_linreg, write_sweep


def _base(folder: Path) -> dict:
    return yaml.safe_load((folder / "linreg.yaml").read_text())


def _run_cli(folder: Path, path: Path, capsys, monkeypatch) -> tuple[int, str]:
    return _run_cli_argv(folder, ["run", str(path)], capsys, monkeypatch)


def _run_cli_argv(folder: Path, argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    import ray

    monkeypatch.chdir(folder)
    code = main(argv)
    err = capsys.readouterr().err
    assert not ray.is_initialized(), "Ray must not start on bad input"
    assert not (folder / "results").exists(), "nothing may be written on bad input"
    return code, err


CASES = {
    "gpu count neither a fraction nor whole": (lambda d: d.update(
        resources={"cpu": 1, "gpu": 1.5}), "resources.gpu", "use 1 or 2, or a fraction"),
    "unknown top-level key": (lambda d: d.update(budgett={"trials": 2}), "budgett",
                              "budget"),
    "write_back typo": (lambda d: d["write_back"].update(learning_rat="train.lr"),
                        "write_back.learning_rat", "lr"),
    "knob without write_back": (lambda d: d["search_space"].update(
        momentum={"type": "uniform", "low": 0.0, "high": 0.9}), "write_back.momentum",
        "momentum: section.momentum"),
    "a knob named like a trials.csv column": (lambda d: (d["search_space"].update(
        status={"type": "categorical", "choices": ["a", "b"]}),
        d["write_back"].update(status="train.status")), "search_space.status",
        "name the knob e.g. 'status_'"),
    "the step count searched as a knob": (lambda d: (d["search_space"].update(
        max_steps={"type": "int", "low": 10, "high": 20}),
        d["write_back"].update(max_steps="train.steps")), "search_space.max_steps",
        "set budget.max_steps"),
    "an infinite bound": (lambda d: d["search_space"].update(
        lr={"type": "uniform", "low": 0.0, "high": float("inf")}), "search_space.lr.high",
        "finite"),
    "a trial count that is true": (lambda d: d.update(budget={"trials": True}),
                                   "budget.trials", "no number"),
    "a bound that is true": (lambda d: d["search_space"].update(
        lr={"type": "uniform", "low": False, "high": True}), "search_space.lr.low",
        "no number"),
    "a choice listed twice": (lambda d: d["search_space"].update(
        lr={"type": "categorical", "choices": [0.1, 0.01, 0.1]}), "search_space.lr",
        "list each choice once"),
    "equal numbers as choices": (lambda d: d["search_space"].update(
        lr={"type": "categorical", "choices": [0, 1.0, 1]}), "search_space.lr",
        "1 is listed twice (1.0 and 1 are one number)"),
    "a number YAML kept as text among numbers": (lambda d: d["search_space"].update(
        grad_clip={"type": "categorical", "choices": [0, "5e-1", 1.0]}),
        "search_space.grad_clip", "write it with a dot and a signed exponent (5.0e-1)"),
    "a quoted number among numbers": (lambda d: d["search_space"].update(
        grad_clip={"type": "categorical", "choices": [0, "64", 1.0]}),
        "search_space.grad_clip", "write it without quotes (64)"),
    "true beside 1 as choices": (lambda d: d["search_space"].update(
        lr={"type": "categorical", "choices": [1, True]}), "search_space.lr",
        "use true/false or numbers, not both"),
    "an int step that does not fit the range": (lambda d: (d["search_space"].update(
        warmup={"type": "int", "low": 0, "high": 60, "step": 7}),
        d["write_back"].update(warmup="train.steps")), "search_space.warmup.step",
        "make high - low a multiple of step, e.g. high: 56 or 63"),
    "an int step past the range": (lambda d: (d["search_space"].update(
        warmup={"type": "int", "low": 0, "high": 60, "step": 1000}),
        d["write_back"].update(warmup="train.steps")), "search_space.warmup.step",
        "every trial would get 0.\n  fix: a step that divides high - low = 60, e.g. step: 15"),
    "a step on a float knob": (lambda d: d["search_space"].update(
        lr={"type": "uniform", "low": 0.0, "high": 1.0, "step": 0.3}),
        "search_space.lr.step", "a float knob takes no step"),
    "a knob name that is no ASCII identifier": (lambda d: (d["search_space"].update(
        {"\u00ff_knob": {"type": "uniform", "low": 0.0, "high": 1.0}}),
        d["write_back"].update({"\u00ff_knob": "train.steps"})), "search_space.\u00ff_knob",
        "ASCII letters, digits and '_'"),
    "a TOML base config": (lambda d: d.update(base_config="linreg_config.toml"),
                           "base_config", "save it as .yaml or .json"),
    "numbers over a list": (lambda d: (d["search_space"].update(
        dropout={"type": "uniform", "low": 0.0, "high": 0.3}),
        d["write_back"].update(dropout="notes.tags")), "write_back.dropout",
        "is a list (['a', 'b'])"),
    "a base value in a one-item list": (lambda d: d.update(base_config={
        "train": {"lr": [0.1], "steps": 60}}), "base_config.train.lr",
        "write the value itself, not in a list: train.lr: 0.1"),
    "the Hugging Face schedule hook without its section": (lambda d: d.update(
        preflight={"scheduler": "sweeps.integrations.huggingface:lr_scheduler"}),
        "preflight.scheduler", "section='training'"),
    "numbers YAML read as text": (lambda d: d["search_space"].update(
        lr={"type": "categorical", "choices": ["1e-3", "1e-4"]}), "search_space.lr",
        "write the numbers with a dot"),
    "log bound <= 0": (lambda d: d["search_space"].update(
        lr={"type": "loguniform", "low": 0.0, "high": 1.0}), "search_space.lr.low",
        "greater than 0"),
    "a knob name misspelt in the space": (lambda d: (d["search_space"].update(
        dropuot={"type": "uniform", "low": 0.0, "high": 0.4}),
        d["write_back"].update(dropout="train.lr")), "search_space.dropuot",
        "did you mean 'dropout'? Use one name in both places"),
    "a knob of your own spelt two ways": (lambda d: (d["search_space"].update(
        sched={"type": "categorical", "choices": ["a", "b"]}),
        d["write_back"].update(shed="train.sched")), "write_back.shed",
        "rename write_back.shed to 'sched', or search_space.sched to 'shed'"),
    "a knob written to a section another knob writes inside": (lambda d: (
        d["search_space"].update(dropout={"type": "uniform", "low": 0.0, "high": 0.3}),
        d["write_back"].update(lr="train", dropout="train.lr")), "write_back.lr",
        "'train' is a section holding 'train.lr' (knob dropout)"),
    "a knob written to the section its neighbour's leaf is in": (lambda d: (
        d["search_space"].update(dropout={"type": "uniform", "low": 0.0, "high": 0.3}),
        d["write_back"].update(lr="train", dropout="train.dropout")), "write_back.lr",
        "give each knob its own leaf path, e.g. 'lr: train.lr'"),
    "a knob name misspelt in write_back": (lambda d: d["write_back"].update(
        {"lrr": d["write_back"].pop("lr")}), "write_back.lrr", "did you mean 'lr'?"),
    "a knob key misspelt": (lambda d: d["search_space"].update(
        lr={"type": "loguniform", "low": 1e-4, "hgih": 0.3}), "search_space.lr.hgih",
        "did you mean 'high'?"),
    "low > high": (lambda d: d["search_space"].update(
        lr={"type": "loguniform", "low": 1.0, "high": 0.1}), "search_space.lr",
        "swap them: low: 0.1, high: 1.0"),
    "choices a scalar": (lambda d: d["search_space"].update(
        lr={"type": "categorical", "choices": 0.1}), "search_space.lr.choices",
        "write a list, e.g. [0.1]"),
    "a choice that is a list": (lambda d: d["search_space"].update(
        lr={"type": "categorical", "choices": [[0.9, 0.999], [0.9, 0.95]]}),
        "search_space.lr.choices.0", "name each choice with a string"),
    "write_back to a section": (lambda d: d["write_back"].update(lr="train"),
                                "write_back.lr", "write the knob to one of its keys (train.lr"),
    "write_back path not in the config": (lambda d: d["write_back"].update(lr="train.lrr"),
                                          "write_back.lr", "did you mean 'train.lr'? Else"),
    "unknown compile mode": (lambda d: (d["search_space"].update(
        compile={"type": "categorical", "choices": ["none", "turbo"]}),
        d["write_back"].update(compile="train.compile")), "search_space.compile",
        "reduce-overhead"),
    "unknown knob type": (lambda d: d["search_space"].update(
        lr={"type": "logscale", "low": 1e-3, "high": 1.0}), "search_space.lr.type",
        "loguniform"),
    "trainer does not import": (lambda d: d.update(trainer="no_such_module:train"),
                                "trainer", "no_such_module"),
    "trainer module typo": (lambda d: d.update(trainer="linreg_trianer:train"), "trainer",
                            "did you mean 'linreg_trainer:train'?"),
    "trainer not callable": (lambda d: d.update(trainer="linreg_trainer:torch"), "trainer",
                             "train(config, report)"),
    "trainer attribute missing": (lambda d: d.update(trainer="linreg_trainer:trian"),
                                  "trainer", "did you mean 'linreg_trainer:train'?"),
    "trainer wrong form": (lambda d: d.update(trainer="linreg_trainer.train"), "trainer",
                           "module:function"),
    "collision with scalar": (lambda d: d["write_back"].update(lr="experiment.lr"),
                              "write_back.lr", "'experiment'"),
    "step budget below one trial": (lambda d: d["budget"].update(total_steps=10),
                                    "budget.total_steps", "fix: total_steps: "),
    "grace past one trial": (lambda d: d["budget"].update(grace_steps=10_000),
                             "budget.grace_steps", "fix: grace_steps: "),
    "negative trials": (lambda d: d["budget"].update(trials=0), "budget.trials",
                        "greater than or equal to 1"),
    "a seed Optuna's sampler cannot take": (lambda d: d.update(seed=2**32), "seed",
                                            "less than or equal to 2147483647"),
    "a CPU share finer than Ray counts": (lambda d: d.update(resources={"cpu": 0.00015}),
                                          "resources.cpu", "fix: cpu: 0.0001"),
    "fresh seeds past any use": (lambda d: d.update(confirm={"seeds": 10**11}),
                                 "confirm.seeds", "less than or equal to 100"),
    "reserved write_back path": (lambda d: d["write_back"].update(lr="sweep.lr"),
                                 "write_back.lr", "reserved"),
    "bare list knob": (lambda d: d["search_space"].update(lr=[0.1, 0.01]),
                       "search_space.lr", "categorical"),
    "unknown rule setting": (lambda d: d["rules"].update(blowup_ratoi=3), "rules.blowup_ratoi",
                             "blowup_ratio"),
    "name with a trailing newline": (lambda d: d.update(name="demo\n"), "name", "letters"),
    "high: probe on a knob other than lr": (lambda d: (d["search_space"].update(
        wd={"type": "uniform", "low": 0.0, "high": "probe"}), d["write_back"].update(
        wd="train.wd")), "search_space.wd.high", "give wd's high a number"),
    "high: probe on an int lr": (lambda d: d["search_space"].update(
        lr={"type": "int", "low": 1, "high": "probe"}), "search_space.lr.high",
        "high: probe}"),
    "high: probe with low 0": (lambda d: d["search_space"].update(
        lr={"type": "uniform", "low": 0.0, "high": "probe"}), "search_space.lr.low",
        "low: 1.0e-4"),
    "a bound that is text": (lambda d: d["search_space"].update(
        lr={"type": "uniform", "low": 0.0, "high": "abc"}), "search_space.lr.high",
        "fix: give a value that is a valid number (you gave 'abc';"),
    "low: probe": (lambda d: d["search_space"].update(
        lr={"type": "loguniform", "low": "probe", "high": 1.0}), "search_space.lr.low",
        "high: probe"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_sweep_file_exits_2_naming_the_key(case, linreg_dir, capsys, monkeypatch):
    mutate, key, fix_hint = CASES[case]
    data = _base(linreg_dir)
    mutate(data)
    path = write_sweep(linreg_dir, data, "bad.yaml")
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    assert code == 2
    assert f"error: {key}:" in err
    assert "fix:" in err
    assert fix_hint in err


def test_malformed_yaml(linreg_dir, capsys, monkeypatch):
    path = linreg_dir / "broken.yaml"
    path.write_text("name: x\ntrainer: [unclosed\n")
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    assert code == 2
    assert "not valid YAML at line" in err


def test_a_tab_in_the_yaml_is_named_with_its_fix(linreg_dir, capsys, monkeypatch):
    """PyYAML's "found character '\\t' that cannot start any token" read as noise; the
    message says it is a tab and where, and how to replace it."""
    path = linreg_dir / "tabbed.yaml"
    path.write_text((linreg_dir / "linreg.yaml").read_text().replace("  lr:", "\tlr:", 1))
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    err = " ".join(err.split())
    assert code == 2 and "is not valid YAML at line" in err
    assert "a tab, which YAML does not take there" in err and "replace the tab at line" in err


def test_base_config_not_a_mapping(linreg_dir, capsys, monkeypatch):
    (linreg_dir / "linreg_config.yaml").write_text("- just\n- a list\n")
    code, err = _run_cli(linreg_dir, linreg_dir / "linreg.yaml", capsys, monkeypatch)
    assert code == 2
    assert "error: base_config:" in err and "not a mapping" in err


def test_sweep_file_not_a_mapping(linreg_dir, capsys, monkeypatch):
    path = linreg_dir / "list.yaml"
    path.write_text("- a\n- b\n")
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    assert code == 2 and "not a mapping" in err


def test_missing_file(linreg_dir, capsys, monkeypatch):
    code, err = _run_cli(linreg_dir, linreg_dir / "nope.yaml", capsys, monkeypatch)
    assert code == 2 and "no sweep file" in err


def test_a_folder_given_as_the_sweep_file_names_the_yaml_files_in_it(linreg_dir, capsys,
                                                                     monkeypatch):
    code, err = _run_cli_argv(linreg_dir, ["validate", "."], capsys, monkeypatch)
    assert code == 2
    assert "error: FILE: . is a folder, not a sweep file" in err
    assert "give the sweep YAML file in it:" in err and "linreg.yaml" in err


def test_kinds_that_may_differ_from_the_base_config_stay_valid(linreg_dir):
    """A float knob over an int value, text over a null value, numbers over text, and
    true/false beside other numbers than 1 and 0 in one knob's choices."""
    from sweeps.spec.loader import load_sweep

    edit_linreg(linreg_dir, train={"fail": None, "mode": "fast"},
                search_space={"n_steps": {"type": "uniform", "low": 10.0, "high": 60.0},
                              "fail": {"type": "categorical", "choices": ["none", "nan"]},
                              "mode": {"type": "int", "low": 0, "high": 4, "step": 2},
                              "flag": {"type": "categorical", "choices": [True, False, 2]}},
                write_back={"n_steps": "train.steps", "fail": "train.fail",
                            "mode": "train.mode", "flag": "train.flag"}, new_keys=True)
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert set(sweep.space) >= {"n_steps", "fail", "mode", "flag"}


def test_validate_accepts_the_good_file(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    assert main(["validate", "linreg.yaml"]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "lr (loguniform)" in out
    edit_linreg(linreg_dir, search_space={"lr": {"type": "loguniform", "low": 0.01, "high": 1},
                                          "warmup": {"type": "int", "low": 0, "high": 20}},
                write_back={"lr": "train.lr", "warmup": "train.steps"})
    assert main(["validate", "linreg.yaml"]) == 0
    assert "warmup (int)" in capsys.readouterr().out, "the type as the sweep file writes it"
    assert not (linreg_dir / "results").exists()


def test_write_back_path_missing_from_the_base_config_is_refused(linreg_dir, capsys,
                                                                 monkeypatch):
    data = _base(linreg_dir)
    data["write_back"]["lr"] = "train.lrr"  # a typo would write a key the trainer never reads
    path = write_sweep(linreg_dir, data, "typo.yaml")
    monkeypatch.chdir(linreg_dir)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "write_back.lr: 'train.lrr' is not in the base config" in err
    assert "did you mean 'train.lr'?" in err and "never see the sampled value" in err
    assert "new_keys: true" in err
    assert main(["run", str(path)]) == 2
    assert not (linreg_dir / "results").exists(), "nothing written"
    data["new_keys"] = True  # the user means it: the key is added, with a note
    write_sweep(linreg_dir, data, "typo.yaml")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "write_back.lr: 'train.lrr' is not in the base config and will be added" in out


def test_a_base_value_outside_a_log_range_is_not_an_error(linreg_dir):
    """A base config with weight_decay 0 and a log-scale weight_decay knob: the search
    starts from the range's middle instead of the base value."""
    from sweeps.spec.loader import load_sweep
    from sweeps.spec.space import LogUniform, contains
    from sweeps.tune.searcher import initial_points

    assert not contains(LogUniform(type="loguniform", low=1e-6, high=0.1), 0.0)
    edit_linreg(linreg_dir, search_space={"lr": {"type": "loguniform", "low": 1e-5,
                                                 "high": 30.0}},
                initial_points=[{}], train={"lr": 0.0})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    (point,) = initial_points(sweep)
    assert 1e-5 < point["lr"] < 30.0


def test_a_bad_value_says_what_was_given_and_what_the_key_means(linreg_dir, capsys,
                                                                monkeypatch):
    data = _base(linreg_dir)
    data["confirm"] = {"tolerance": -1}
    path = write_sweep(linreg_dir, data, "bad.yaml")
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    assert code == 2 and "error: confirm.tolerance:" in err
    assert "you gave -1; confirm.tolerance means: largest gap between a candidate's worst " \
        "and best seed" in err


def test_bytes_that_are_not_utf8_exit_2_naming_the_line(linreg_dir, capsys, monkeypatch):
    path = linreg_dir / "latin1.yaml"
    text = (linreg_dir / "linreg.yaml").read_text()
    path.write_bytes(b"# r\xe9glages\n" + text.encode())  # a Latin-1 comment on line 1
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    assert code == 2
    assert "line 1: byte 0xe9 is not UTF-8 text" in err and "save the file as UTF-8" in err


@pytest.mark.parametrize("file", ["linreg.yaml", "linreg_config.yaml"])
def test_a_key_given_twice_exits_2_naming_both_lines(file, linreg_dir, capsys, monkeypatch):
    path = linreg_dir / file
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    path.write_text("\n".join([*lines, lines[first]]) + "\n")  # a top-level key again
    code, err = _run_cli(linreg_dir, linreg_dir / "linreg.yaml", capsys, monkeypatch)
    key = lines[first].split(":")[0]
    assert code == 2
    assert f"line {len(lines) + 1}: key {key!r} is given twice (first on line {first + 1})" \
        in err
    assert "keep one of them" in err


@pytest.mark.parametrize("line,key", [("budget: {trials: 4, trials: 1000000}", "trials"),
                                      ("search_space: {lr: {type: loguniform, low: 1.0e-5, "
                                       "high: 1.0}, lr: 5}", "lr")])
def test_a_key_given_twice_on_one_line_exits_2(line, key, linreg_dir, capsys, monkeypatch):
    path = linreg_dir / "linreg.yaml"
    top, kept, skipping = line.split(":")[0] + ":", [], False
    for ln in path.read_text().splitlines():  # drop that section (and its indented lines)
        skipping = ln.startswith(top) or (skipping and ln.startswith(" "))
        if not skipping:
            kept.append(ln)
    path.write_text("\n".join([*kept, line]) + "\n")
    code, err = _run_cli(linreg_dir, path, capsys, monkeypatch)
    assert code == 2
    assert f"line {len(kept) + 1}: key {key!r} is given twice (on the same line)" in err


def test_aliases_that_expand_past_a_million_values_exit_2(linreg_dir, capsys, monkeypatch):
    """Nine nested levels of ten aliases ("billion laughs") in the base config read as
    shared references; the first copy of them filled the machine's memory."""
    path = linreg_dir / "linreg_config.yaml"
    levels = "".join(f"l{k + 1}: &l{k + 1} [{', '.join([f'*l{k}'] * 10)}]\n"
                     for k in range(8))
    path.write_text(path.read_text() + "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + levels)
    code, err = _run_cli(linreg_dir, linreg_dir / "linreg.yaml", capsys, monkeypatch)
    assert code == 2 and "expand it to more than 1,000,000 values" in err, err
    assert "base_config" in err


def test_merge_keys_merge(linreg_dir):
    """`<<: *anchor` is YAML's merge key, which Hydra and OmegaConf read; it was refused as
    an unknown tag."""
    from sweeps.spec.loader import load_sweep

    path = linreg_dir / "linreg_config.yaml"
    path.write_text(path.read_text() + "shared: &shared {depth: 2, width: 1}\n"
                    "merged: {<<: *shared, width: 3}\n")
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert sweep.base_config["merged"] == {"depth": 2, "width": 3}


def test_an_eval_loss_objective_is_told_the_adapter_reports_val_loss(linreg_dir):
    """A Hugging Face user writes the Trainer's own name; train_hf reports it as val_loss,
    which `validate` could not say before a whole `try` had run."""
    from sweeps.spec.loader import load_sweep

    edit_linreg(linreg_dir, objectives=[{"metric": "eval_loss", "mode": "min"}])
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert any(n.startswith("objectives.0: the Hugging Face adapter (train_hf) reports the "
                            "Trainer's eval_loss as val_loss") for n in sweep.notes)


def test_text_choices_over_a_number_get_a_note_naming_the_path(linreg_dir):
    """Most likely the wrong path (a crash in the trainer), but some settings take both
    (Lightning's precision: 32 or "16-mixed"; compile: 0 for off): a note, not exit 2."""
    from sweeps.spec.loader import load_sweep

    edit_linreg(linreg_dir, search_space={"optim": {"type": "categorical",
                                                    "choices": ["sgd", "adam"]}},
                write_back={"optim": "train.steps"})
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    assert any(n.startswith("write_back.optim: train.steps in the base config is a number "
                            "(60), but the knob's values are text") and "e.g. train.fail" in n
               for n in sweep.notes), sweep.notes


@pytest.mark.parametrize("flags, key", [
    (["--values", "0.01,0.1", "--seeds", "0"], "--seeds"),
    (["--values", "nan"], "no finite number"),
    (["--values", "1e-3,1e-3"], "listed twice"),
    (["--values", "1e-3", "--steps", "0"], "--steps"),
    (["--range", "0:1"], "is not 0 < LOW <= HIGH"),
])
def test_bad_stability_options_exit_2_before_anything_runs(flags, key, linreg_dir, capsys,
                                                          monkeypatch):
    """--seeds 0 ran nothing and exited 0 (moving the previous grid aside), nan ran and
    crashed every seed, a value listed twice ran twice, --steps 0 became the budget."""
    code, err = _run_cli_argv(linreg_dir, ["stability", "linreg.yaml", "--param", "lr", *flags],
                              capsys, monkeypatch)
    assert code == 2 and key in err


def test_try_refuses_the_reserved_sweep_section(linreg_dir, capsys, monkeypatch):
    """--set sweep.seed=3 printed as set while the trainer got seed 0."""
    code, err = _run_cli_argv(linreg_dir, ["try", "linreg.yaml", "--set", "sweep.seed=3"],
                              capsys, monkeypatch)
    assert code == 2 and "--set sweep.seed" in err and "--seed S" in err


def test_a_base_value_that_is_text_for_a_numeric_knob_is_said_so(linreg_dir):
    """`lr: ${oc.env:MY_LR,0.003}` (an interpolation) for a loguniform knob: the note said
    "a categorical value is not among its choices"."""
    from sweeps.spec.loader import load_sweep

    path = linreg_dir / "linreg_config.yaml"
    path.write_text(path.read_text().replace("lr: 0.1", "lr: ${oc.env:MY_LR,0.003}", 1))
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir, import_trainer=False)
    note = next(n for n in sweep.notes if "lies off the search space" in n)
    assert "lr: '${oc.env:MY_LR,0.003}' is no number" in note and "categorical" not in note
