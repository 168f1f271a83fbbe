"""A knob written back to an option of a flag-driven script's argparse parser must take the
values that option takes on the script's own command line: the trial gets them by
``setattr``, past argparse's ``choices`` and ``type``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.commands.cli import main

SCRIPT = (
    "import argparse\n"
    "parser = argparse.ArgumentParser()\n"
    "parser.add_argument('--lr', type=float, default=0.1)\n"
    "parser.add_argument('--optimizer', choices=['adamw', 'sgd'], default='adamw')\n"
    "parser.add_argument('--batch-size', type=int, default=32)\n"
    "parser.add_argument('--amp', action='store_true')\n"
    "parser.add_argument('--steps', type=int, default=100)\n"
    "def run(args, report=None):\n"
    "    pass\n")


def _project(tmp_path: Path, knobs: str) -> Path:
    (tmp_path / "choicetrain.py").write_text(SCRIPT)
    (tmp_path / "choicesweep.py").write_text(
        "from choicetrain import parser, run\n"
        "def train(config, report):\n"
        "    run(parser.parse_args([]), report)\n")
    (tmp_path / "defaults.yaml").write_text(
        "lr: 0.1\noptimizer: adamw\nbatch_size: 32\namp: false\nsteps: 100\n")
    (tmp_path / "sweep.yaml").write_text(
        "name: flags\ntrainer: choicesweep:train\nbase_config: defaults.yaml\n"
        f"search_space:\n  lr: {{type: loguniform, low: 1.0e-4, high: 1.0}}\n{knobs}"
        "write_back: {lr: lr, max_steps: steps, "
        + ", ".join(f"{k}: {k}" for k in ("optimizer", "batch_size", "amp")
                    if f"  {k}:" in knobs) + "}\n"
        "budget: {trials: 4, max_steps: 50}\n")
    return tmp_path / "sweep.yaml"


@pytest.mark.parametrize("knobs, key, said", [
    ("  optimizer: {type: categorical, choices: [AdamW, sgd]}\n",
     "search_space.optimizer.choices", "'AdamW' is not one of its choices ('adamw', 'sgd')"),
    ("  batch_size: {type: uniform, low: 16, high: 128}\n",
     "search_space.batch_size", "'16.0' is not an int"),
    ("  batch_size: {type: categorical, choices: [32, 64.5]}\n",
     "search_space.batch_size.choices", "'64.5' is not an int"),
], ids=["choice-spelt-otherwise", "float-range-to-int", "float-choice-to-int"])
def test_a_value_the_scripts_parser_refuses_exits_2(tmp_path: Path, capsys, knobs: str,
                                                    key: str, said: str) -> None:
    sweep = _project(tmp_path, knobs)
    assert main(["validate", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert key in err and said in err, err
    assert not (tmp_path / "results").exists()


def test_values_the_parser_takes_are_valid(tmp_path: Path, capsys) -> None:
    """The parser's own spellings, an int range to an int option and a bool to a
    store_true option (left to docs/trainers.md) pass."""
    sweep = _project(tmp_path, "  optimizer: {type: categorical, choices: [adamw, sgd]}\n"
                               "  batch_size: {type: int, low: 16, high: 128}\n"
                               "  amp: {type: categorical, choices: [true, false]}\n")
    assert main(["validate", str(sweep)]) == 0, capsys.readouterr().err
