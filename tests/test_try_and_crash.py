"""`sweeps try` in-process, and trainer exceptions classified as trial outcomes."""

from __future__ import annotations

import json

import pytest
import torch

from sweeps.commands.cli import main
from sweeps.spec.loader import load_sweep
from sweeps.trial.failures import classify, process_exit_raises
from sweeps.trial.run import run_trainer
from tests.conftest import edit_linreg


def test_try_reports_a_stable_run(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=0.05", "--steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "try: lr=0.05" in out
    assert "no rule fired over 30 reports" in out
    assert not (linreg_dir / "results" / "linreg" / "trials.csv").exists()


def test_try_reports_the_verdict_of_an_unstable_run(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=20"]) == 1
    out = capsys.readouterr().out
    # linreg at lr 20 multiplies its loss ~10x on step 2 and ~1e6x on step 3: an
    # explosion, stopped on the report that confirms it
    assert "stopped" in out and "divergence at step 3" in out and "explosion" in out


def test_try_compiles_and_leaves_the_results_folder_alone(linreg_dir, capsys, monkeypatch):
    """``try`` keeps torch's own compile cache: a cache in results/<name>/ without the
    results marker made the next ``sweeps run`` refuse the folder."""
    monkeypatch.chdir(linreg_dir)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    code = main(["try", "linreg.yaml", "--set", "lr=0.05", "--set", "train.compile=default",
                 "--steps", "20"])
    assert code == 0
    out = capsys.readouterr().out
    assert "train.compile=default" in out
    assert "compile: 1 graph(s), 0 recompile(s), 0 graph break(s)" in out
    assert not (linreg_dir / "results").exists(), "nothing written under results/"


def test_try_says_what_the_sweep_would_warn_of_a_run_that_ended_ok(linreg_dir, capsys,
                                                                   monkeypatch):
    """``try`` prints the warnings the sweep records with a trial that ended ok, in the
    same words: here the quality objective last reported at step 30 of 35."""
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=0.05", "--set", "train.fail=no_final_val",
                 "--steps", "35"]) == 0
    out = capsys.readouterr().out
    assert "no rule fired over 35 reports" in out
    assert "stale_quality: val_loss was last reported at step 30 of 35" in out


def test_try_adds_an_unknown_top_level_key_with_a_note_that_it_is_no_knob(
        linreg_dir, capsys, monkeypatch):
    """A top-level key is a config path like a dotted one (a trainer switch such as
    bug=shuffle); the note says it is not a knob, so a name the trainer never reads shows."""
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "momentum=0.9", "--steps", "5"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: momentum is not in the base config: added for this try as a top-level " \
        "key, not a knob (the knobs: lr)" in out


@pytest.mark.parametrize(("pair", "says"), [
    ("lr=abc", "--set lr: 'abc' is not a number, and lr is a loguniform knob"),
    ("lr=\x1b[31mred", "--set lr: '\\x1b[31mred' is not a number"),  # not YAML: text
    ("lrr=0.01", "fix: did you mean lr=0.01?"),
    ("train.lr=fast", "--set lr: 'fast' is not a number"),  # the knob's own path
    ("notes.tags=a", "the base config holds a list there (['a', 'b']), not 'a'"),
    ("train.steps=many", "'many' is not a number, and the base config holds the number 60"),
    ("lr=nan", "--set lr: nan is no finite number"),  # Adam crashed on it; `stability` refused
    ("lr=.inf", "--set lr: .inf is no finite number"),
])
def test_try_refuses_a_set_value_the_trainer_could_not_take(linreg_dir, capsys, monkeypatch,
                                                           pair, says):
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", pair]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err
    assert not (linreg_dir / "results").exists()


def test_try_takes_any_number_for_a_knob_of_numeric_choices(linreg_dir, capsys, monkeypatch):
    edit_linreg(linreg_dir, search_space={
        "lr": {"type": "categorical", "choices": [0.01, 0.05]}})
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=0.02", "--steps", "10"]) == 0
    assert main(["try", "linreg.yaml", "--set", "lr=fast", "--steps", "10"]) == 2
    assert "is not one of lr's choices" in " ".join(capsys.readouterr().err.split())


def test_try_notes_a_set_path_the_base_config_lacks(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=0.05", "--set", "train.stesp=30",
                 "--steps", "10"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: train.stesp is not in the base config: added for this try (did you mean "
            "train.steps=30?)") in out
    # a top-level key is a config path too; only a near-miss of a knob's name is refused
    assert main(["try", "linreg.yaml", "--set", "lr=0.05", "--set", "bug=shuffle",
                 "--steps", "10"]) == 0
    assert "note: bug is not in the base config: added for this try as a top-level" in \
        " ".join(capsys.readouterr().out.split())


def test_try_names_an_objective_metric_the_trainer_never_reports(linreg_dir, capsys,
                                                                 monkeypatch):
    edit_linreg(linreg_dir, objectives=[{"metric": "val_los", "mode": "min"}])
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=0.05", "--steps", "20"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: objectives.0.metric: the trainer never reported 'val_los'" in err
    assert "fix: did you mean 'val_loss'?" in err


@pytest.mark.parametrize("fail,step", [("raise", 0), ("raise_late", 4)])
def test_trainer_exception_is_a_crash_with_its_traceback(linreg_dir, fail, step):
    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    sweep.base_config["train"]["fail"] = fail
    results = []
    reporter = run_trainer(sweep, {"lr": 0.05}, "t1", results.append)
    assert reporter.verdict.reason == "crash" and reporter.verdict.step == step
    final = results[-1]
    assert final["sweeps/status"] == "crash" and final["sweeps/final"] == 1
    assert "planted failure" in final["sweeps/traceback"]
    assert "Traceback" in final["sweeps/traceback"]
    if fail == "raise":  # a message of several lines: its summary first, then its end
        assert json.loads(final["sweeps/evidence"])["error"] == \
            "RuntimeError: planted failure before any report … key: [/INST] value"


def test_try_prints_the_traceback_of_a_crash(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    edit_linreg(linreg_dir, train={"fail": "raise_late"})
    assert main(["try", "linreg.yaml", "--steps", "10"]) == 1
    out = capsys.readouterr().out
    assert "Traceback (most recent call last)" in out and "linreg_trainer.py" in out
    assert "ValueError: planted failure at step 5" in out
    assert out.index("Traceback") < out.index("stopped: crash at step")


def test_classify_oom_and_compile_errors():
    assert classify(torch.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert classify(RuntimeError("DefaultCPUAllocator: can't allocate memory: out of memory"))\
        == "oom"
    try:
        import torch._dynamo.exc as dynamo_exc

        raise dynamo_exc.BackendCompilerFailed(lambda: None, RuntimeError(
            "Cannot find a working triton installation"))
    except Exception as exc:  # noqa: BLE001
        assert classify(exc) == "compile_error"
    assert classify(KeyError("x")) == "crash"


def test_try_says_when_the_lr_knob_does_not_reach_the_optimizer(linreg_dir, capsys,
                                                                monkeypatch):
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "linreg.yaml", "--set", "lr=0.05", "--steps", "10"]) == 0
    assert "does not follow" not in capsys.readouterr().out
    # a write-back path the trainer never reads: the optimizer keeps the base config's 0.1
    edit_linreg(linreg_dir, write_back={"lr": "train.learning_rate"}, new_keys=True)
    assert main(["try", "linreg.yaml", "--set", "lr=1e-5", "--steps", "10"]) == 2
    out = capsys.readouterr().out
    assert "does not follow the sampled lr 1e-05" in out and "train.learning_rate" in out
    assert "seed 0" in out


def test_a_try_that_ends_inside_its_warmup_is_not_called_an_ignored_lr(linreg_dir, capsys,
                                                                         monkeypatch):
    """10 steps of a 5000-step warmup reach lr x 0.002: the LR is still rising, the knob is
    read; it was exit 2, "the trainer does not read the lr knob's path"."""
    monkeypatch.chdir(linreg_dir)
    assert main(["try", "hooked.yaml", "--set", "lr=0.005", "--set", "warmup=5000",
                 "--steps", "10"]) == 0
    assert "does not follow" not in capsys.readouterr().out


def test_try_says_when_a_warmup_never_moves_the_lr(linreg_dir, capsys, monkeypatch):
    """The warmup knob written where the trainer never reads it (as a scheduler never
    stepped looks): the LR is the same on every report, and try exits 2 naming the path."""
    monkeypatch.chdir(linreg_dir)
    edit_linreg(linreg_dir, new_keys=True,
                search_space={"warmup": {"type": "int", "low": 0, "high": 40}},
                write_back={"warmup": "train.warmup_steps"})
    assert main(["try", "linreg.yaml", "--set", "warmup=0", "--steps", "30"]) == 0
    assert main(["try", "linreg.yaml", "--set", "warmup=20", "--steps", "30"]) == 2
    err = capsys.readouterr().err
    assert "write_back.warmup: the LR was 0.1 on every report" in err and "with warmup 20" in err
    assert "scheduler.step()" in err


def test_try_stops_a_schedule_that_climbs_past_the_sampled_lr(linreg_dir, capsys, monkeypatch):
    monkeypatch.chdir(linreg_dir)
    # hooked_trainer's cosine with an absolute floor: lr 1e-3 trains at 1e-2 after warmup
    sets = ["--set", "lr=0.001", "--set", "warmup=5"]
    assert main(["try", "hooked.yaml", *sets, "--set", "train.min_lr=0.01"]) == 1
    out = capsys.readouterr().out
    assert "lr_anomaly at step 6: kind=climbs_past_lr" in out
    assert "sampled_lr=0.001, reference=0.001, ratio=10" in out
    assert main(["try", "hooked.yaml", *sets]) == 0  # the same cosine down to 0


def test_the_sampled_lr_a_trial_is_judged_against_includes_the_lr_probe(linreg_dir):
    from sweeps.protocol import LR_SCALE_KEY
    from sweeps.trial.run import trial_settings, trial_values

    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    config = {"lr": 0.01, LR_SCALE_KEY: 2.0}
    assert trial_settings(sweep, trial_values(sweep, {"lr": 0.01})).sampled_lr == 0.01
    assert trial_settings(sweep, trial_values(sweep, config)).sampled_lr == 0.02
    assert trial_settings(sweep, {}).sampled_lr is None  # no lr knob: the check is skipped


def test_dataloader_workers_forked_by_a_trainer_end_normally():
    """A forked DataLoader worker keeps the trainer thread's id; its own ``os._exit`` at its
    end must end it, not raise the trainer's TrainerExit inside the child (``sweeps run``
    then hung, and ``sweeps try`` printed trainer_exit verdicts for a stable trial)."""
    data = torch.utils.data.TensorDataset(torch.arange(64.0))
    with process_exit_raises():
        for _ in range(2):
            loader = torch.utils.data.DataLoader(
                data, batch_size=8, num_workers=2,
                multiprocessing_context=torch.multiprocessing.get_context("fork"))
            assert sum(float(b[0].sum()) for b in loader) == sum(range(64))
