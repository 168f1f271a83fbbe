"""Preflight: the LR schedule, the input scale and compile modes, before any trial runs."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from sweeps.commands.cli import main
from sweeps.preflight import run_preflight
from sweeps.preflight.compile_check import check_modes
from sweeps.spec.loader import load_sweep


def _edit(folder, **train):
    data = yaml.safe_load((folder / "hooked.yaml").read_text())
    data["base_config"]["train"].update(train)
    (folder / "hooked.yaml").write_text(yaml.safe_dump(data))


def test_restarting_schedule_is_flagged_before_any_trial(linreg_dir, capsys, monkeypatch):
    import ray

    monkeypatch.chdir(linreg_dir)
    _edit(linreg_dir, schedule="restarts")
    assert main(["run", "hooked.yaml"]) == 3
    err = capsys.readouterr().err
    assert "warm_restart" in err and "--no-preflight" in err
    assert "`sweeps preflight FILE` runs the checks alone" in err
    out = linreg_dir / "results" / "hooked"
    assert not out.exists(), "nothing ran: nothing is kept (no half-written results folder)"
    assert not ray.is_initialized()
    assert main(["preflight", "hooked.yaml"]) == 3  # the checks alone keep what they found
    found = json.loads((out / "preflight.json").read_text())
    restart = [f for f in found if f["check"] == "schedule"]
    assert restart and restart[0]["level"] == "error"
    assert restart[0]["evidence"]["evidence"]["kind"] == "warm_restart"
    assert restart[0]["evidence"]["step"] == 11  # T_0 = 40 // 4: back to the peak at step 11
    assert "allow_lr_restarts" in (out / "preflight.md").read_text()


def test_healthy_schedule_and_raw_inputs(linreg_dir):
    sweep, findings = run_preflight(load_sweep(linreg_dir / "hooked.yaml", workdir=linreg_dir))
    assert not [f for f in findings if f.level == "error"]
    assert [f.message for f in findings if f.check == "inputs"] == [
        "every input feature is on a sane scale"]
    _edit(linreg_dir, raw_inputs=True)
    _, findings = run_preflight(load_sweep(linreg_dir / "hooked.yaml", workdir=linreg_dir))
    inputs = [f for f in findings if f.check == "inputs"]
    assert [f.evidence["feature"] for f in inputs] == ["time"]
    assert inputs[0].level == "warning" and "normalise" in inputs[0].fix


def test_peak_above_the_sampled_lr_and_zero_lr(linreg_dir, monkeypatch):
    from sweeps.preflight.schedule_check import check_curve
    from sweeps.rules.settings import RuleSettings

    peak = check_curve([0.1, 0.5, 0.4], 0.1, RuleSettings(), "lr=0.1")
    assert any("peaks at 0.5" in f.message for f in peak)
    zero = check_curve([0.1] * 5 + [0.0] * 5, 0.1, RuleSettings(warmup_steps=2), "lr=0.1")
    assert zero and "zero_lr" in zero[0].message


def test_a_schedule_that_follows_a_metric_is_not_checked_not_an_error(linreg_dir):
    """ReduceLROnPlateau needs the validation loss to step: preflight says it did not check
    it (it was an error, exit 3, 'would spoil every trial')."""
    _edit(linreg_dir, schedule="plateau")
    _, findings = run_preflight(load_sweep(linreg_dir / "hooked.yaml", workdir=linreg_dir))
    schedule = [f for f in findings if f.check in ("schedule", "hooks")]
    assert [(f.level, f.message.split(":")[0]) for f in schedule] == [
        ("info", "the LR schedule was not checked")]
    assert "ReduceLROnPlateau follows a metric" in schedule[0].message


def test_trainer_without_hooks_is_told_so(linreg_dir):
    _, findings = run_preflight(load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir))
    assert {f.check for f in findings} == {"schedule", "inputs"}
    assert all(f.level == "info" and "not checked" in f.message for f in findings)


@pytest.mark.slow
def test_compile_modes_that_cannot_work_are_dropped(monkeypatch):
    usable, findings = check_modes(["none", "default", "reduce-overhead"], gpu_requested=False)
    assert usable == ["none", "default"]
    assert "CUDA graphs" in findings[0].message
    assert findings[-1].level == "info" and "'default' compiled" in findings[-1].message
    # a machine without a working C++ compiler: inductor cannot build its CPU kernels
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    usable, findings = check_modes(["none", "default"], gpu_requested=False)
    assert usable == ["none"]
    assert "InvalidCxxCompiler" in findings[0].message


def test_a_continuous_dropout_beside_compiled_modes_gets_a_note(linreg_dir):
    from sweeps.preflight.compile_check import shared_compiles
    from sweeps.spec.space import Categorical, Uniform

    sweep = load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)
    space = dict(sweep.space)
    assert shared_compiles(space, ["none", "default"]) == []  # no dropout knob
    space["dropout"] = Uniform(type="uniform", low=0.0, high=0.3)
    note = shared_compiles(space, ["none", "default"])
    assert len(note) == 1 and note[0].level == "info" and "categorical" in note[0].fix
    assert shared_compiles(space, ["none"]) == []
    space["dropout"] = Categorical(type="categorical", choices=[0.0, 0.1])
    assert shared_compiles(space, ["default"]) == []


def test_a_schedule_floor_above_the_low_end_of_the_lr_range_is_flagged(linreg_dir):
    _edit(linreg_dir, min_lr=0.01)  # an absolute floor: lr 1e-3 would train at 1e-2
    _, findings = run_preflight(load_sweep("hooked.yaml", workdir=linreg_dir))
    errors = [f for f in findings if f.level == "error"]
    assert errors and all("lr=0.001" in f.message for f in errors)
    assert "peaks at 0.01" in errors[0].message


def test_preflight_says_which_schedule_checks_ran(linreg_dir):
    _, findings = run_preflight(load_sweep("hooked.yaml", workdir=linreg_dir))
    ran = [f for f in findings if f.check == "schedule" and f.level == "info"]
    assert len(ran) == 1 and "6 knob settings" in ran[0].message
    assert "lr=0.001, warmup=0" in ran[0].message and "lr=0.1, warmup=10" in ran[0].message


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine without CUDA")
def test_reduce_overhead_asked_for_gpus_without_cuda_is_dropped_saying_so():
    usable, findings = check_modes(["none", "reduce-overhead"], gpu_requested=True)
    assert usable == ["none"]
    assert "no CUDA to probe it on" in findings[0].message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_modes_are_probed_on_the_gpu():
    """reduce-overhead must capture its CUDA graphs and max-autotune compile with Triton on
    the GPU; a mode that cannot is dropped with torch's reason."""
    usable, findings = check_modes(["none", "reduce-overhead", "max-autotune"],
                                   gpu_requested=True)
    dropped = {f.evidence["mode"]: f for f in findings if f.level == "warning"}
    assert set(usable) | set(dropped) == {"none", "reduce-overhead", "max-autotune"}
    for finding in dropped.values():
        assert finding.evidence["device"] == "cuda" and finding.evidence["error"]
