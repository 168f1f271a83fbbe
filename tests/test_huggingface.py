"""The transformers.Trainer integration against the real Trainer: a 1-layer GPT-2 with a
64-token vocabulary built from its config, generated tokens, CPU, nothing downloaded."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: no download can start
transformers = pytest.importorskip("transformers")

from sweeps.integrations.huggingface import (  # noqa: E402
    SweepsCallback,
    lr_scheduler,
    lr_scheduler_flat,
    sweep_training_args,
    train_hf,
)
from sweeps.preflight.schedule_check import check_curve, lr_curve  # noqa: E402
from sweeps.rules.settings import RuleSettings  # noqa: E402
from sweeps.spec.loader import load_sweep  # noqa: E402
from sweeps.trial.run import run_trainer  # noqa: E402
from tests.conftest import Reports, read_results_csv, run_cli_in  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "huggingface"
CAP = RuleSettings().grad_norm_cap


def _load_example():
    spec = importlib.util.spec_from_file_location("hf_example_train", EXAMPLE / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()
BASE = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
DATA = {**BASE["data"], "n_train": 256, "n_val": 64}


@pytest.fixture(autouse=True)
def own_train_module():
    """The example's trainer is a module named ``train``, as a user's often is, and so is
    another example's: each test imports its own and leaves ``sys.modules`` as it was."""
    before = sys.modules.pop("train", None)
    yield
    sys.modules.pop("train", None)
    if before is not None:
        sys.modules["train"] = before


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains with one torch thread (see tests/conftest.py)."""


def model_init():
    return example.build_model(BASE["model"], DATA)


class AfterClipping(transformers.TrainerCallback):
    """The grad norm at on_pre_optimizer_step: after transformers clipped (or did not)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))


def hf_logs(trainer, key: str) -> dict[int, float]:
    return {h["step"]: h[key] for h in trainer.state.log_history if key in h}


def test_reports_match_what_transformers_logs_and_the_norm_is_taken_before_clipping(tmp_path):
    train_set, val_set = example.make_datasets(DATA)
    reports = Reports()
    after = AfterClipping()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, learning_rate=3e-3, warmup_steps=3, max_grad_norm=0.5,
        logging_steps=1, eval_strategy="steps", eval_steps=4, save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model_init=model_init, args=args, train_dataset=train_set,
                                   eval_dataset=val_set, callbacks=[SweepsCallback(reports),
                                                                    after])
    trainer.train()

    assert [r["step"] for r in reports] == list(range(1, 9)), "one report per optimizer step"
    grad_norm, lr, loss = hf_logs(trainer, "grad_norm"), hf_logs(trainer, "learning_rate"), \
        hf_logs(trainer, "loss")
    for r in reports:
        assert r["grad_norm"] == pytest.approx(grad_norm[r["step"]], rel=1e-5)
        assert r["lr"] == pytest.approx(lr[r["step"]], rel=1e-9, abs=1e-15)
        assert r["loss"] == pytest.approx(loss[r["step"]], rel=1e-5)
        assert r["nonfinite_grads"] == 0 and r["dead_params"] == 0
        assert r["clipped"] == (1.0 if r["grad_norm"] > 0.5 else 0.0)
    assert len({r["lr"] for r in reports}) > 3, "warmup and decay: the LR changes"
    # transformers clipped these steps (the norm it stepped with is 0.5); the reports have
    # the norm from before
    clipped = [i for i, r in enumerate(reports) if r["grad_norm"] > 0.6]
    assert clipped
    assert all(after.norms[i] == pytest.approx(0.5, rel=1e-4) for i in clipped)
    evals = hf_logs(trainer, "eval_loss")
    assert {r["step"]: r["val_loss"] for r in reports if "val_loss" in r} == \
        pytest.approx(evals) and sorted(evals) == [4, 8]


def test_token_labels_give_the_guess_of_their_frequencies(tmp_path):
    """A language model of shuffled labels learns their unigram frequencies and no more:
    its loss sits at their entropy, below ln(vocab). The callback reported no
    label_entropy, so flat_at_baseline judged it against ln(vocab) and it was handed over."""
    row = [1] * 8 + [2] * 4 + [3] * 2 + [-100] * 2  # the padding is left out
    rows = [torch.tensor(row)[torch.randperm(16, generator=torch.Generator().manual_seed(i))]
            for i in range(32)]
    train_set = [{"input_ids": r.clamp(min=0), "labels": r} for r in rows]
    reports = Reports()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=1e-3, save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    transformers.Trainer(model_init=model_init, args=args, train_dataset=train_set,
                         callbacks=[SweepsCallback(reports)]).train()

    shares = [8 / 14, 4 / 14, 2 / 14]
    entropy = -sum(p * math.log(p) for p in shares)
    assert [r["label_entropy"] for r in reports] == pytest.approx([entropy] * 3)
    assert [r["label_majority"] for r in reports] == pytest.approx([8 / 14] * 3)
    assert entropy < math.log(BASE["data"]["vocab_size"])


def test_max_grad_norm_0_is_no_clipping_and_the_norm_is_still_reported(tmp_path):
    train_set, val_set = example.make_datasets(DATA)
    reports = Reports()
    after = AfterClipping()
    config = {**BASE, "data": DATA, "training_args": {
        **BASE["training_args"], "learning_rate": 3e-2, "max_grad_norm": 0, "warmup_steps": 0,
        "logging_steps": 1, "per_device_train_batch_size": 8},
        "sweep": {"trial_id": "t", "seed": 5, "max_steps": 10, "device": "cpu"}}
    trainer = train_hf(config, reports, model_init=model_init, train_dataset=train_set,
                       eval_dataset=val_set, callbacks=[after])

    args = trainer.args
    assert args.max_grad_norm == 0 and args.max_steps == 10
    assert args.seed == 5 and args.data_seed == 5 and args.use_cpu
    assert args.save_strategy == "steps" and args.report_to in ([], "none", ["none"])
    assert not Path(args.output_dir).exists(), "the temporary output_dir is removed"
    assert [r["step"] for r in reports] == list(range(1, 11))
    norms = [r["grad_norm"] for r in reports]
    assert norms == pytest.approx(after.norms, rel=1e-6), "nothing clipped the gradients"
    assert max(norms) > 1.0, "transformers' default max_grad_norm (1.0) would have clipped"
    assert all("clipped" not in r for r in reports)
    logged = hf_logs(trainer, "grad_norm")  # transformers >= 5 logs it without clipping too
    assert all(r["grad_norm"] == pytest.approx(logged[r["step"]], rel=1e-5)
               for r in reports if r["step"] in logged)
    assert "val_loss" in reports[-1] and reports[-1]["step"] == 10, "evaluated at the end"


def test_a_retried_trial_resumes_from_the_trainers_last_save(tmp_path):
    """What sweeps does when a worker dies: the checkpoint ``report`` was handed is saved
    with ``torch.save`` and its path comes back as ``config["sweep"]["checkpoint"]``."""
    train_set, val_set = example.make_datasets(DATA)

    def config(steps: int) -> dict:
        return {**BASE, "data": DATA, "training_args": {
            **BASE["training_args"], "eval_strategy": "steps", "eval_steps": 4,
            "per_device_train_batch_size": 8},
            "sweep": {"trial_id": "t", "seed": 1, "max_steps": steps, "device": "cpu"}}

    first = Reports()
    train_hf(config(12), first, model_init=model_init, train_dataset=train_set,
             eval_dataset=val_set)
    assert [r["step"] for r in first] == list(range(1, 13)), "every step reported once"
    assert [step for step, _ in first.checkpoints] == [4, 8, 12], "each evaluation's save"
    step, state = first.checkpoints[1]  # the worker died after step 8's save
    assert state["folder"] == "checkpoint-8" and "trainer_state.json" in state["files"]
    path = tmp_path / "state.pt"
    torch.save(state, path)

    retried = config(12)
    retried["sweep"]["checkpoint"] = str(path)
    again = Reports()
    trainer = train_hf(retried, again, model_init=model_init, train_dataset=train_set,
                       eval_dataset=val_set)
    assert [r["step"] for r in again] == [9, 10, 11, 12], "continues after the save"
    assert "val_loss" in again[-1] and trainer.state.global_step == 12
    assert again[0]["loss"] == pytest.approx(first[8]["loss"], rel=1e-4), \
        "the same step 9: weights, optimizer and data order came back"

    quiet = Reports()
    trainer = train_hf(config(4), quiet, model_init=model_init, train_dataset=train_set,
                       eval_dataset=val_set, checkpoint=False)
    assert not quiet.checkpoints and trainer.args.save_strategy == "no"


def test_without_an_eval_dataset_the_trainer_saves_each_quarter_and_a_retry_resumes(tmp_path):
    """Nothing evaluates, so no evaluation can carry a save: the Trainer saves at each
    quarter of max_steps instead, and a retried trial continues from the last save."""
    train_set, _ = example.make_datasets(DATA)

    def config() -> dict:
        return {**BASE, "data": DATA, "training_args": {
            **BASE["training_args"], "per_device_train_batch_size": 8, "eval_strategy": "no"},
            "sweep": {"trial_id": "t", "seed": 1, "max_steps": 12, "device": "cpu"}}

    first = Reports()
    trainer = train_hf(config(), first, model_init=model_init, train_dataset=train_set)
    assert trainer.args.save_strategy == "steps" and trainer.args.save_steps == 3
    assert [r["step"] for r in first] == list(range(1, 13)), "every step reported once"
    assert [step for step, _ in first.checkpoints] == [3, 6, 9, 12]
    assert not any("val_loss" in r for r in first)
    path = tmp_path / "state.pt"
    torch.save(first.checkpoints[1][1], path)  # the worker died after step 6's save
    retried = config()
    retried["sweep"]["checkpoint"] = str(path)
    again = Reports()
    train_hf(retried, again, model_init=model_init, train_dataset=train_set)
    assert [r["step"] for r in again] == [7, 8, 9, 10, 11, 12], "continues after the save"
    assert again[0]["loss"] == pytest.approx(first[6]["loss"], rel=1e-4)


@pytest.mark.slow
def test_the_hooks_work_in_a_compiled_model():
    """torch_compile (the aot_eager backend: dynamo and AOTAutograd without inductor's
    C++ build) traces the loss hook and keeps the gradient hooks."""
    train_set, val_set = example.make_datasets(DATA)
    no_dropout = {**BASE["model"], "dropout": 0.0}  # the same numbers with or without it
    runs = {}
    for mode in ("none", "default"):
        reports = Reports()
        config = {"training_args": {**BASE["training_args"], "torch_compile_backend":
                                    "aot_eager" if mode != "none" else None},
                  "sweep": {"seed": 0, "max_steps": 4, "device": "cpu"}}
        trainer = train_hf(config, reports, compile_mode=mode,
                           model_init=lambda: example.build_model(no_dropout, DATA),
                           train_dataset=train_set, eval_dataset=val_set)
        assert trainer.args.torch_compile == (mode != "none")
        runs[mode] = reports
    eager, compiled = runs["none"], runs["default"]
    assert "compile_s" in compiled[0] and "compile_s" not in eager[0]
    for key in ("loss", "grad_norm", "lr", "nonfinite_grads"):
        assert [r[key] for r in compiled] == pytest.approx([r[key] for r in eager], rel=1e-4)


def first_step_showing(history: list[dict], reason: str) -> int:
    """The first report on which the problem is there to see."""
    for h in history:
        values = [h.get("loss", 0.0), h.get("grad_norm", 0.0), h.get("val_loss", 0.0)]
        if reason == "non_finite" and not all(math.isfinite(v) for v in values):
            return h["step"]
        if reason == "grad_blowup" and h.get("grad_norm", 0.0) > CAP:
            return h["step"]
    raise AssertionError(f"no report shows {reason}")


@pytest.mark.parametrize(("knobs", "eval_steps", "reason"), [
    ({"lr": 1e6, "warmup": 0, "grad_clip": 0}, 100, "non_finite"),
    ({"lr": 1e4, "warmup": 0, "grad_clip": 0}, 100, "grad_blowup"),
    ({"lr": 1e6, "warmup": 0, "grad_clip": 0}, 2, "non_finite"),  # found on an eval step
])
def test_a_diverging_lr_ends_the_trial_on_the_step_it_shows(tmp_path, knobs, eval_steps,
                                                             reason):
    """Through the sweeps runner: TrialStopped leaves trainer.train() and the verdict is
    the trial's outcome."""
    sweep = load_sweep(EXAMPLE / "sweep.yaml", workdir=tmp_path)
    sweep.base_config["data"].update(n_train=256, n_val=64)
    sweep.base_config["training_args"]["eval_steps"] = eval_steps
    results: list[dict] = []
    reporter = run_trainer(sweep, knobs, "t1", results.append)

    verdict = reporter.verdict
    assert verdict is not None and verdict.reason == reason, verdict
    assert verdict.step == first_step_showing(reporter.history, reason) <= 3
    assert reporter.history[-1]["step"] == verdict.step, "no step ran after the verdict"
    assert results[-1]["sweeps/status"] == "unstable"
    assert results[-1]["sweeps/reason"] == reason
    assert results[-1]["sweeps/stop_step"] == verdict.step
    if eval_steps <= verdict.step:
        assert "val_loss" in reporter.history[-1], "the eval step's report waited for it"


def test_training_args_take_the_trials_settings_and_keep_the_users():
    config = {"training_args": {**BASE["training_args"], "eval_strategy": "no"},
              "sweep": {"seed": 2, "max_steps": 40, "device": "cuda:0"}}
    args = sweep_training_args(config, "/tmp/x")
    assert args["max_steps"] == 40 and args["seed"] == args["data_seed"] == 2
    assert args["use_cpu"] is False and args["output_dir"] == "/tmp/x"
    assert (args["eval_strategy"], args["eval_steps"]) == ("steps", 40), "val_loss at the end"
    assert args["save_strategy"] == "no" and args["report_to"] == "none"
    assert args["lr_scheduler_type"] == "linear" and args["weight_decay"] == 0.01
    assert sweep_training_args(config, "/tmp/x", evaluate=False)["eval_strategy"] == "no"
    kept = {**config, "training_args": BASE["training_args"]}  # eval every 100 steps: kept
    assert sweep_training_args(kept, "/tmp/x")["eval_steps"] == 100


@pytest.mark.parametrize(("schedule", "errors"), [
    ({"lr_scheduler_type": "linear"}, []),
    ({"lr_scheduler_type": "cosine_with_restarts", "lr_scheduler_kwargs": {"num_cycles": 3}},
     ["warm_restart"]),
])
def test_the_preflight_hook_steps_the_schedule_trainer_builds(schedule, errors):
    config = {"training_args": {**BASE["training_args"], **schedule, "warmup_steps": 10},
              "sweep": {"seed": 0, "max_steps": 90}}
    lrs = lr_curve(lr_scheduler, config, 1e-3, 90)
    assert lrs[0] == 0.0 and max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) == 10
    findings = check_curve(lrs, 1e-3, RuleSettings(warmup_steps=10), "x")
    assert [f.evidence["evidence"]["kind"] for f in findings] == errors


def test_a_flat_args_file_gives_its_training_arguments_and_a_missing_section_is_an_error():
    """An ``HfArgumentParser`` args file is flat: model, data and training arguments side
    by side. ``section=None`` takes the ``TrainingArguments`` fields from it; the default
    section missing used to give every field its default in silence (a
    ``cosine_with_restarts`` schedule passed preflight, the swept knobs did nothing)."""
    flat = {"model_name_or_path": "none", "block_size": 16,
            **{**BASE["training_args"], "lr_scheduler_type": "cosine_with_restarts",
               "lr_scheduler_kwargs": {"num_cycles": 3}, "warmup_steps": 10},
            "sweep": {"seed": 0, "max_steps": 90}}
    args = sweep_training_args(flat, "/tmp/x", section=None)
    assert args["learning_rate"] == BASE["training_args"]["learning_rate"]
    assert "block_size" not in args and "model_name_or_path" not in args
    with pytest.raises(ValueError, match="no 'training_args' section.*section=None"):
        sweep_training_args(flat, "/tmp/x")
    with pytest.raises(ValueError, match="no 'training_args' section"):
        lr_curve(lr_scheduler, flat, 1e-3, 90)
    lrs = lr_curve(lr_scheduler_flat, flat, 1e-3, 90)
    findings = check_curve(lrs, 1e-3, RuleSettings(warmup_steps=10), "x")
    assert [f.evidence["evidence"]["kind"] for f in findings] == ["warm_restart"]


@pytest.mark.slow
def test_sweep_of_the_example_hands_over_a_config_the_script_runs(tmp_path, monkeypatch,
                                                                 ray_session):
    folder = tmp_path / "hf"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["data"].update(n_train=512, n_val=64)
    config["training_args"]["max_steps"] = 30  # the user's own run below, kept short
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    sweep = yaml.safe_load((folder / "sweep.yaml").read_text())
    sweep.update(budget={"trials": 3, "max_steps": 20, "concurrent": 2, "scheduler": "none"},
                 confirm={"seeds": 1, "lr_probe": 0, "keep": 1},
                 initial_points=[{"lr": 1.0, "warmup": 0, "grad_clip": 0}])
    (folder / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))

    assert run_cli_in(folder, "run", "sweep.yaml", "--quiet") == 0
    out = folder / "results" / "hf-tiny-gpt2"
    trials = read_results_csv(out / "trials.csv")
    search = trials[trials["role"].isin(["search", "base"])]
    assert set(search["status"]) <= {"ok", "unstable"}, trials[["status", "reason"]]
    wild = search[search["lr"] == 1.0].iloc[0]
    assert wild["status"] == "unstable"
    assert wild["reason"] in ("divergence", "grad_blowup", "non_finite")
    assert "schedule is sane" in (out / "preflight.md").read_text()  # the HF schedule hook
    assert int(wild["steps"]) == int(wild["stop_step"]) < 20
    assert (search[search["status"] == "ok"]["objective_val_loss"] < math.log(64)).all()

    stable = sorted((out / "stable").glob("*.yaml"))
    assert stable
    handed = yaml.safe_load(stable[0].read_text())
    assert set(handed) == set(config) and set(handed["training_args"]) == \
        set(config["training_args"]), "the user's layout, no key added or lost"
    assert handed["training_args"]["save_strategy"] == "no"
    monkeypatch.chdir(folder)
    metrics = example.main(["--config", str(stable[0])])  # the user's script, YAML as is
    assert metrics["eval_loss"] < math.log(64)


def test_transformers_progress_bars_are_off_while_a_trial_trains_and_back_after():
    """A checkpoint's "Writing model shards" bar is transformers' own, not the Trainer's:
    off in the trial (the Trainer's own bar is off by disable_tqdm), the user's setting
    restored when train_hf returns (``sweeps try`` runs in the user's process)."""
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    seen: list[bool] = []

    class Watch(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            seen.append(hf_logging.is_progress_bar_enabled())

    train_set, _ = example.make_datasets(DATA)
    config = {**BASE, "data": DATA, "training_args": {
        **BASE["training_args"], "per_device_train_batch_size": 8, "eval_strategy": "no"},
        "sweep": {"trial_id": "t", "seed": 1, "max_steps": 4, "device": "cpu"}}
    assert hf_logging.is_progress_bar_enabled()
    train_hf(config, Reports(), model_init=model_init, train_dataset=train_set,
             callbacks=[Watch()])
    assert seen and not any(seen), "saved with the bars off"
    assert hf_logging.is_progress_bar_enabled()


def test_with_accumulation_a_model_that_ignores_the_item_count_reports_its_mean_loss(tmp_path):
    """The Trainer hands ``num_items_in_batch`` to any model whose forward takes ``**kwargs``
    and then sums the micro-batches' losses; BERT's classifier takes it and returns a plain
    mean, so transformers logs twice its loss with 2 micro-batches (the sweep stopped every
    config as diverging). The report is the mean of the losses the model returned."""
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32, num_labels=2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (64, 12), generator=gen)
    rows = [{"input_ids": x, "attention_mask": torch.ones_like(x),
             "labels": int((x == 5).sum()) % 2} for x in ids]
    model = transformers.BertForSequenceClassification(config)
    micro: list[float] = []
    model.register_forward_hook(
        lambda m, a, out: micro.append(float(out["loss"].detach())) if m.training else None)
    reports = Reports()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows,
                                   callbacks=[SweepsCallback(reports)])
    trainer.train()

    assert len(micro) == 8
    means = [sum(micro[i:i + 2]) / 2 for i in range(0, 8, 2)]
    assert [r["loss"] for r in reports] == pytest.approx(means, rel=1e-6)
    assert all(0.5 < r["loss"] < 1.0 for r in reports), "near ln 2, the random guess"
