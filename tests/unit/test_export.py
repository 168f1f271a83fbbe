"""Write-back: chosen knob values merged into the user's own base config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweeps.results.export import config_for, render, write_config
from sweeps.spec.loader import Sweep


def test_config_for_sets_write_back_paths_only(linreg_sweep: Sweep) -> None:
    config = config_for(linreg_sweep, {"lr": 0.003})
    assert config["train"]["lr"] == 0.003
    assert config["notes"] == {"owner": "someone", "tags": ["a", "b"]}
    assert "sweep" not in config and "lr" not in config
    assert linreg_sweep.base_config["train"]["lr"] == 0.1


def test_render_header_then_the_user_layout(linreg_sweep: Sweep) -> None:
    text = render(linreg_sweep, {"lr": 0.0123456789},
                  {"trial": "abc", "val_loss": 0.123456789, "seeds": {"mean": 0.5, "n": 3}})
    head, *rest = text.splitlines()
    assert re.fullmatch(r"# Written by sweeps \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ for sweep "
                        r"'linreg' \(.*linreg\.yaml\)", head)
    assert rest[:3] == ["# trial: abc", "# val_loss: 0.123457", "# seeds: mean=0.5, n=3"]
    data = yaml.safe_load(text)
    assert list(data) == ["experiment", "train", "notes"]
    assert data["train"]["lr"] == 0.0123456789  # the value itself is written in full


def test_write_config_writes_atomically_and_reads_back(linreg_sweep: Sweep,
                                                       tmp_path: Path) -> None:
    path = tmp_path / "out" / "best.yaml"
    assert write_config(path, linreg_sweep, {"lr": 0.5}, {}) == path
    assert yaml.safe_load(path.read_text())["train"]["lr"] == 0.5
    assert sorted(p.name for p in path.parent.iterdir()) == ["best.overrides", "best.yaml"], \
        "no temporary file left behind"
    assert path.with_suffix(".overrides").read_text() == "train.lr=0.5\n"


def test_a_config_step_count_unlike_the_budget_is_noted_and_warned_in_the_header(
        tmp_path: Path) -> None:
    from tests.unit.conftest import load_linreg

    sweep = load_linreg(tmp_path, budget={"max_steps": 40})  # train.steps stays 60
    assert any("train.steps is 60 but every trial runs budget.max_steps = 40" in note
               and "'max_steps: train.steps' under write_back" in note for note in sweep.notes)
    header = render(sweep, {"lr": 0.2}, {}).splitlines()
    assert "# steps per run: 40 (budget.max_steps)" in header
    assert any(line.startswith("# WARNING: train.steps below is 60, not the 40 steps")
               for line in header)


def test_write_back_max_steps_carries_the_steps_run_into_trials_and_hand_overs(
        tmp_path: Path) -> None:
    from tests.unit.conftest import load_linreg

    sweep = load_linreg(tmp_path, budget={"max_steps": 40},
                        write_back={"lr": "train.lr", "max_steps": "train.steps"})
    assert not any("budget.max_steps" in note for note in sweep.notes)
    assert list(sweep.space) == ["lr"]  # not a knob
    assert sweep.trial_config({"lr": 0.2}, trial_id="t", seed=0)["train"]["steps"] == 40
    short = sweep.trial_config({"lr": 0.2}, trial_id="t", seed=0, max_steps=10)
    assert short["train"]["steps"] == 10 and short["sweep"]["max_steps"] == 10
    path = write_config(tmp_path / "best.yaml", sweep, {"lr": 0.2}, {})
    assert yaml.safe_load(path.read_text())["train"] == {"lr": 0.2, "steps": 40,
                                                         "fail": "none"}
    assert path.with_suffix(".overrides").read_text() == "train.lr=0.2\ntrain.steps=40\n"
    assert not any(line.startswith("# WARNING") for line in path.read_text().splitlines())


def test_write_back_max_steps_takes_every_path_that_holds_the_step_count(
        tmp_path: Path) -> None:
    """A trainer's max_steps and its scheduler's total_steps: with one path mapped, the
    scheduler kept 600 in every trial and every hand-over, and nothing said so."""
    from sweeps.errors import SpecError
    from tests.unit.conftest import load_linreg

    load_linreg(tmp_path)
    config = yaml.safe_load((tmp_path / "linreg_config.yaml").read_text())
    config["sched"] = {"total_steps": 600}
    (tmp_path / "scheduled.yaml").write_text(yaml.safe_dump(config))

    def load_linreg(folder: Path, **edits: object) -> Sweep:
        from tests.unit.conftest import load_linreg as plain

        return plain(folder, base_config="scheduled.yaml", **edits)

    one = load_linreg(tmp_path, budget={"max_steps": 40},
                      write_back={"lr": "train.lr", "max_steps": "train.steps"})
    assert any("sched.total_steps is 600 but every trial runs budget.max_steps = 40: list "
               "it under write_back: max_steps: [train.steps, sched.total_steps]" in note
               for note in one.notes), one.notes
    both = load_linreg(tmp_path, budget={"max_steps": 40}, write_back={
        "lr": "train.lr", "max_steps": ["train.steps", "sched.total_steps"]})
    assert not any("budget.max_steps" in note for note in both.notes)
    trial = both.trial_config({"lr": 0.2}, trial_id="t", seed=0, max_steps=10)
    assert trial["train"]["steps"] == 10 == trial["sched"]["total_steps"]
    path = write_config(tmp_path / "best.yaml", both, {"lr": 0.2}, {})
    written = yaml.safe_load(path.read_text())
    assert written["train"]["steps"] == 40 == written["sched"]["total_steps"]
    assert path.with_suffix(".overrides").read_text() == \
        "train.lr=0.2\ntrain.steps=40\nsched.total_steps=40\n"
    for paths, key in ((["train.steps", "sched.totl_steps"], "write_back.max_steps.1"),
                       (["train.steps", "train.steps"], "write_back.max_steps")):
        with pytest.raises(SpecError) as err:
            load_linreg(tmp_path, write_back={"lr": "train.lr", "max_steps": paths})
        assert err.value.key == key, err.value
    with pytest.raises(SpecError) as err:
        load_linreg(tmp_path, write_back={"lr": ["train.lr", "train.steps"]})
    assert err.value.key == "write_back.lr" and "only max_steps takes a list" in err.value.fix


def test_only_the_runs_own_step_count_is_noted(linreg_sweep: Sweep) -> None:
    from sweeps.spec.loader import unmapped_step_count

    spec, space = linreg_sweep.spec, linreg_sweep.space  # budget.max_steps 60
    assert unmapped_step_count(spec, space, {"eval": {"steps": 10},
                                             "warmup": {"num_steps": 5}}) is None
    assert unmapped_step_count(spec, space, {"trainer": {"max_iters": 500}}) == (
        "trainer.max_iters", 500)
    assert unmapped_step_count(spec, space, {"train": {"steps": 60}}) is None  # the same


def test_a_knob_named_max_steps_is_bad_input(tmp_path: Path) -> None:
    """Every trial runs budget.max_steps (the trainer's sweep.max_steps): a searched
    max_steps wrote 17 into the hand-over of a config that ran 60 steps."""
    from sweeps.errors import SpecError
    from tests.unit.conftest import load_linreg

    with pytest.raises(SpecError) as err:
        load_linreg(tmp_path, search_space={"lr": {"type": "loguniform", "low": 0.01,
                                                   "high": 1.0},
                                            "max_steps": {"type": "categorical",
                                                          "choices": [40, 60]}},
                    write_back={"lr": "train.lr", "max_steps": "train.steps"})
    assert err.value.key == "search_space.max_steps"
    assert "budget.max_steps" in err.value.fix


def _json_base(folder: Path, text: str | None = None) -> Sweep:
    """The linreg sweep with its base config as a JSON file (``text``, else the YAML's)."""
    import json

    from tests.unit.conftest import load_linreg

    load_linreg(folder)  # copies the files
    config = yaml.safe_load((folder / "linreg_config.yaml").read_text())
    (folder / "linreg_config.json").write_text(text or json.dumps(config, indent=4))
    return load_linreg(folder, base_config="linreg_config.json")


def test_a_json_base_config_is_handed_over_as_json_with_its_header_beside_it(
        tmp_path: Path) -> None:
    import json

    from sweeps.results.export import handed_over, header_lines

    sweep = _json_base(tmp_path)
    assert sweep.config_format == "json"
    path = write_config(tmp_path / "stable" / "rank-01-abc.json", sweep, {"lr": 0.25},
                        {"trial": "abc"})
    data = json.loads(path.read_text())  # the file is JSON alone, no comment lines
    assert data == {**sweep.base_config, "train": {**sweep.base_config["train"], "lr": 0.25}}
    assert list(data) == ["experiment", "train", "notes"]
    assert header_lines(path)[1:3] == ["trial: abc", "steps per run: 60 (budget.max_steps)"]
    assert handed_over(tmp_path / "stable") == [path]
    # the format survives the resolved copy (base config inline) a results folder keeps
    from sweeps.spec.loader import load_sweep_dict

    again = load_sweep_dict(sweep.resolved(), base_dir=tmp_path, workdir=tmp_path,
                            import_trainer=False)
    assert again.config_format == "json"


def test_a_json_base_config_is_read_as_json(tmp_path: Path) -> None:
    import pytest

    from sweeps.errors import SpecError

    text = '{\n  "experiment": "linreg",\n  "train": {"lr": 0.1, "steps": 60,}\n}\n'
    with pytest.raises(SpecError) as err:  # YAML would take the trailing comma
        _json_base(tmp_path, text)
    assert err.value.key == "base_config"
    assert "is not valid JSON at line 3, column" in str(err.value)
    twice = '{"train": {"lr": 0.1, "steps": 60}, "train": {"lr": 1}}'
    with pytest.raises(SpecError, match="key 'train' is given twice"):
        _json_base(tmp_path, twice)


@pytest.mark.parametrize("text", ["a b", "a\\b", "it's", "x\\", "a\\'b", "tab\there", "1e-3",
                                  "q\\\\", "café ok", "a,b", "[1]", "=x"])
def test_text_values_come_back_from_hydras_override_parser_as_they_were(text: str) -> None:
    """Hydra reads a backslash inside quotes as itself (two only before a quote): a value
    `a\\b` was written `'a\\\\b'` and composed with two backslashes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sweeps.spec.hydra_config import overrides

    (line,) = overrides({"train": {}}, {"train.note": text})
    assert OverridesParser.create().parse_override(line).value() == text


def test_text_that_reads_as_a_number_stays_text_for_yaml_1_2_readers(linreg_sweep: Sweep,
                                                                     tmp_path: Path) -> None:
    """A text choice "1e-3" was written bare; PyYAML reads that back as text, OmegaConf
    (Hydra's reader) as the float 0.001."""
    from omegaconf import OmegaConf

    path = write_config(tmp_path / "best.yaml", linreg_sweep, {"lr": "1e-3"}, {})
    assert yaml.safe_load(path.read_text())["train"]["lr"] == "1e-3"
    assert OmegaConf.load(path).train.lr == "1e-3"
    assert write_config(tmp_path / "n.yaml", linreg_sweep, {"lr": 1e-3}, {}).read_text() \
        .count("lr: 0.001") == 1


def test_a_config_clipped_on_almost_every_step_says_the_clip_set_its_step() -> None:
    """A loss summed over a batch of 512 gave grad norms of 80-780 against a clip of 5 on
    every step: the hand-over held, its header said nothing. Now it says how often and by
    how much; a config clipped now and then says nothing."""
    from sweeps.record.book import TrialRecord
    from sweeps.results.files import clipped_throughout

    def run(clipped_every: int) -> TrialRecord:
        history = [{"step": k, "grad_norm": 200.0 if k % clipped_every == 0 else 2.0,
                    "clipped": 1.0 if k % clipped_every == 0 else 0.0} for k in range(1, 101)]
        return TrialRecord("t", {"lr": 0.1, "grad_clip": 5.0}, 0, history=history)

    said = clipped_throughout(run(1))
    assert said is not None and said.startswith("clipped on 100% of its steps, its median "
                                                "grad norm 40x grad_clip 5")
    assert "summed over the batch" in said
    assert clipped_throughout(run(3)) is None
