"""Hugging Face ``transformers.Trainer`` integration: a callback and a ``train`` adapter.

:class:`SweepsCallback` reports what the rules need once per optimizer step of any
``Trainer``; :func:`train_hf` turns a few lines into a sweeps trainer
``train(config, report)`` whose write-back paths are ``TrainingArguments`` fields.
See docs/huggingface.md.

Where the numbers come from (transformers' own ``grad_norm`` is logged only every
``logging_steps``, and ``on_pre_optimizer_step`` runs after clipping):

* ``grad_norm``, ``nonfinite_grads``, ``dead_params``: :meth:`sweeps.Monitor.grad_stats`,
  run when a backward pass ends (a hook on every trainable parameter's gradient
  accumulation queues it), so before ``clip_grad_norm_``, the optimizer step and
  ``zero_grad``, every step, with clipping on or off. With gradient accumulation the last
  micro-batch's measurement holds the whole step's gradient.
* ``loss``: the ``loss`` the model returns in training mode: the mean over the step's
  micro-batches, or their sum when the model normalised it over the step via
  ``num_items_in_batch``. The Trainer passes that count to any model whose ``forward``
  takes ``**kwargs``, and then sums, though many such models (BERT's classifiers) return
  a plain mean and ignore it, so its logged loss is ``gradient_accumulation_steps`` times
  too large. Here the first micro-batch that gets the count is watched
  (:class:`_Watched`): the sum is taken only when the model's forward used it. A NaN
  stays a NaN (``logging_nan_inf_filter`` hides it in the log).
* ``lr``: the optimizer's LR just before its step (transformers' ``learning_rate``).
* ``label_entropy``, ``label_majority``: of the class ``labels`` the model was given
  (:meth:`sweeps.Monitor.label_guess`; -100 left out), the random guess of unequal class
  or token frequencies, which flat_at_baseline uses when it is below
  ``rules.baseline_loss``.
* ``val_loss``: ``eval_loss`` from ``on_evaluate``, merged into the report of the step it
  evaluated.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError("sweeps.integrations.huggingface needs transformers and accelerate: "
                      "pip install 'sweeps[huggingface]'") from exc

from sweeps.trial.compile import compile_mode as sweeps_compile_mode
from sweeps.trial.monitor import Monitor, is_class_labels

Report = Callable[..., None]  # report(metrics, checkpoint=None)

#: Evaluation metrics that describe the evaluation run, not the model: not reported.
EVAL_TIMINGS = frozenset({"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"})


class _Watched(torch.Tensor):
    """``num_items_in_batch`` as one forward pass gets it: any torch operation on it (a
    loss divided by it, moved to a device) is recorded in ``used``, and computes as on a
    plain tensor (the results are plain tensors)."""

    used: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.used.append(getattr(func, "__name__", str(func)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _watch(items: torch.Tensor) -> tuple[type[_Watched], torch.Tensor]:
    """A :class:`_Watched` subclass of its own (its ``used`` list) and ``items`` as one."""
    watched = type("_Watched", (_Watched,), {"used": []})
    return watched, items.as_subclass(watched)


class SweepsCallback(TrainerCallback):
    """Calls ``report(metrics)`` once per optimizer step of a ``transformers.Trainer``.

    Each report has ``step`` (``state.global_step``), ``loss``, ``grad_norm`` (total L2
    norm before clipping), ``nonfinite_grads``, ``dead_params``, ``lr``, ``step_time``,
    ``clipped`` (when ``max_grad_norm > 0``), ``label_entropy`` and ``label_majority``
    (when the model is given integer ``labels``) and, on a step that evaluates, ``val_loss``
    and every other numeric ``eval_*`` metric under its transformers name. A step that
    evaluates is reported after the evaluation, every other step at its end.

    When ``report`` raises (sweeps' ``TrialStopped``: a rule fired) the exception leaves
    ``trainer.train()`` on that step: no further step, evaluation or save runs, and the
    sweeps runner records the verdict. Do not catch it.

    With ``checkpoint``, a step the Trainer saves is reported once the save is written,
    with the checkpoint folder (``checkpoint-<step>`` in ``output_dir``) as its
    ``checkpoint``: every file's bytes by its path in the folder (:func:`unpack` writes
    them back), so a trial whose worker died resumes from it.

    Args:
        report: the ``report`` callable a sweeps trainer receives.
        checkpoint: hand over each checkpoint the Trainer saves.

    Example:
        >>> seen = []
        >>> callback = SweepsCallback(seen.append)
        >>> # Trainer(model=..., args=..., train_dataset=..., callbacks=[callback]).train()
    """

    def __init__(self, report: Report, *, checkpoint: bool = False) -> None:
        self._report = report
        self._checkpoint = checkpoint
        self._held: dict[str, Any] | None = None  # a step's report waiting for its save
        self._monitor: Monitor | None = None
        self._optimizer: Any = None
        self._handles: list[Any] = []
        self._queued = False
        self._grads: tuple[float, int, int] | None = None
        self._losses: list[torch.Tensor] = []
        self._loss_summed = False
        #: Whether the model normalises its loss by ``num_items_in_batch`` (None: not
        #: known yet; see the module's docstring).
        self._normalises: bool | None = None
        self._watched: type[_Watched] | None = None
        self._lr: float | None = None
        #: ``label_entropy`` and ``label_majority`` of the class ``labels`` seen so far.
        self._labels: dict[str, float] = {}
        self._started = time.perf_counter()
        self._pending: dict[str, Any] | None = None
        #: The step of the last report that carried ``val_loss`` (None before any).
        self.last_val_step: int | None = None

    # ---- measuring -------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._detach()
        self._pending, self._optimizer = None, optimizer
        # a compiled forward gets no stand-in for the count: its sum is taken on trust
        self._normalises = True if args.torch_compile or hasattr(model, "_orig_mod") \
            else None
        self._watched = None
        # The model's parameters only: an accelerate optimizer is no plain torch optimizer.
        self._monitor = Monitor(model)
        for param in model.parameters():
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._on_grad))
        self._handles.append(model.register_forward_pre_hook(self._before_forward,
                                                             with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._on_forward, with_kwargs=True))

    def _on_grad(self, _param: torch.Tensor) -> None:
        """A gradient was accumulated: measure all of them once this backward pass ends
        (through the autograd engine's end-of-backward callback, as DDP and FSDP do)."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._measure)

    def _measure(self) -> None:
        self._queued = False
        norm, nonfinite, dead = self._monitor.grad_stats()
        scaler = getattr(self._optimizer, "scaler", None)  # fp16: grads are still scaled
        if scaler is not None and scaler.is_enabled():
            norm /= float(scaler.get_scale())
        self._grads = (norm, nonfinite, dead)

    def _before_forward(self, module, args, kwargs):
        """On the first training forward given ``num_items_in_batch``, hand the model a
        watched stand-in for it, to learn whether its loss uses it."""
        if self._normalises is not None or not (module.training and torch.is_grad_enabled()):
            return None
        items = kwargs.get("num_items_in_batch")
        if type(items) is not torch.Tensor:
            return None
        self._watched, stand_in = _watch(items)
        return args, {**kwargs, "num_items_in_batch": stand_in}

    def _on_forward(self, module, _args, kwargs, output) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation
        if self._watched is not None:
            self._normalises, self._watched = bool(self._watched.used), None
        labels = kwargs.get("labels")
        if torch.is_tensor(labels) and is_class_labels(labels) and self._monitor is not None:
            self._labels = self._monitor.label_guess(labels)
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if torch.is_tensor(loss):
            self._losses.append(loss.detach().float().clone())
            self._loss_summed = kwargs.get("num_items_in_batch") is not None and \
                self._normalises is not False

    def on_step_begin(self, args, state, control, **kwargs):
        self._flush()
        self._started = time.perf_counter()
        self._losses, self._grads, self._lr, self._labels = [], None, None, {}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        groups = getattr(self._optimizer, "param_groups", None)
        self._lr = float(groups[0]["lr"]) if groups else None

    # ---- reporting -------------------------------------------------------------------

    def on_step_end(self, args, state, control, **kwargs):
        step_time = time.perf_counter() - self._started
        metrics: dict[str, Any] = {"step": state.global_step, "step_time": step_time}
        if self._losses:
            losses = torch.stack(self._losses)
            metrics["loss"] = float(losses.sum() if self._loss_summed else losses.mean())
        skipped = bool(getattr(self._optimizer, "step_was_skipped", False))  # fp16 overflow
        if self._grads is not None and not skipped:
            norm, nonfinite, dead = self._grads
            metrics.update(grad_norm=norm, nonfinite_grads=float(nonfinite),
                           dead_params=float(dead))
            if args.max_grad_norm and args.max_grad_norm > 0:
                metrics["clipped"] = 1.0 if norm > args.max_grad_norm else 0.0
        if self._lr is not None:
            metrics["lr"] = self._lr
        metrics.update(self._labels)
        if state.global_step == 1 and args.torch_compile:
            metrics["compile_s"] = step_time  # the first step includes compilation
        if control.should_evaluate:
            self._pending = metrics  # reported with val_loss once the evaluation ran
        elif self._checkpoint and control.should_save:
            self._held = metrics  # reported with the checkpoint once it is written
        else:
            self._send(metrics, control)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        pending, self._pending = self._pending, None
        if pending is not None and pending["step"] != state.global_step:
            self._send(pending, control)
            pending = None
        entry = pending or {"step": state.global_step}
        for key, value in (metrics or {}).items():
            if key == "eval_loss":
                entry["val_loss"] = value
            elif key.startswith("eval_") and key not in EVAL_TIMINGS \
                    and isinstance(value, (int, float)):
                entry[key] = value
        if "val_loss" in entry:
            self.last_val_step = state.global_step
        if self._checkpoint and control.should_save:
            self._held = entry  # reported with the checkpoint once it is written
        else:
            self._send(entry, control)

    def on_save(self, args, state, control, **kwargs):
        held, self._held = self._held, None
        if held is None:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self._send(held, control, pack(folder) if folder.is_dir() else None)

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()
        self._detach()

    def _flush(self) -> None:
        """Report a step whose evaluation or save never came."""
        waiting = [m for m in (self._pending, self._held) if m is not None]
        self._pending = self._held = None
        for metrics in waiting:
            self._send(metrics, None)

    def _send(self, metrics: dict[str, Any], control: Any, checkpoint: Any = None) -> None:
        try:
            if checkpoint is None:
                self._report(metrics)
            else:
                self._report(metrics, checkpoint=checkpoint)
        except BaseException:  # TrialStopped: leave train() on this step
            if control is not None:
                control.should_training_stop = True
            self._detach()
            raise

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._queued = [], False


def training_section(config: Mapping[str, Any], section: str | None) -> dict[str, Any]:
    """The ``TrainingArguments`` fields of ``config``: its ``section``, or with ``section``
    None every top-level key that is a ``TrainingArguments`` field (one flat args file, as
    ``HfArgumentParser.parse_yaml_file`` reads it, model and data arguments beside them).
    A section the config lacks is an error: every field would be the default, and the
    sweep's knobs written into nothing."""
    if section is None:
        import dataclasses

        from transformers import TrainingArguments

        fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
        return {k: v for k, v in config.items() if k in fields}
    if section not in config:
        raise ValueError(
            f"the config has no {section!r} section of TrainingArguments fields, so every "
            f"field would be its default and the knobs written nowhere; its top-level keys: "
            f"{', '.join(sorted(map(str, config))) or 'none'}. Fix: keep the fields under "
            f"{section!r}, pass section='<yours>', or section=None for one flat args file "
            "(HfArgumentParser's parse_yaml_file / parse_json_file layout)")
    return dict(config.get(section) or {})


def sweep_training_args(config: Mapping[str, Any], output_dir: str, *,
                        section: str | None = "training_args", evaluate: bool = True,
                        checkpoint: bool = False) -> dict[str, Any]:
    """``TrainingArguments`` keyword arguments: :func:`training_section` with a trial's
    settings.

    From the reserved ``sweep`` section: ``max_steps``, ``seed`` (also ``data_seed``) and
    the device (``use_cpu`` on ``cpu``). For a sweep: ``output_dir``, no reporting
    integrations, no progress bars (unless the section sets ``disable_tqdm``) and, when
    ``evaluate`` and the section does not evaluate, an evaluation at the last step; no
    checkpoints, or with ``checkpoint`` one at each evaluation (the last one kept; without
    evaluations, at each quarter of ``max_steps``, else each epoch).
    Everything else is the section as written.

    Example:
        >>> config = {"training_args": {"learning_rate": 1e-3, "max_grad_norm": 0},
        ...           "sweep": {"seed": 3, "max_steps": 40, "device": "cpu"}}
        >>> args = sweep_training_args(config, "/tmp/out")
        >>> args["learning_rate"], args["max_steps"], args["seed"], args["eval_steps"]
        (0.001, 40, 3, 40)
    """
    args = training_section(config, section)
    sweep = config.get("sweep") or {}
    if sweep.get("max_steps") is not None:
        args["max_steps"] = int(sweep["max_steps"])
    if sweep.get("seed") is not None:
        args["seed"] = args["data_seed"] = int(sweep["seed"])
    if sweep.get("device"):
        args["use_cpu"] = str(sweep["device"]) == "cpu"
    args.update(output_dir=str(output_dir), report_to="none", save_strategy="no",
                load_best_model_at_end=False, push_to_hub=False)
    args.setdefault("disable_tqdm", True)
    if evaluate and str(args.get("eval_strategy", "no")) == "no":
        steps = args.get("max_steps")
        if steps and int(steps) > 0:
            args.update(eval_strategy="steps", eval_steps=int(steps))
        else:
            args["eval_strategy"] = "epoch"
    strategy = str(args.get("eval_strategy", "no"))
    if checkpoint and strategy != "no":
        args.update(save_strategy=strategy, save_total_limit=1, save_only_model=False)
        if strategy == "steps":
            args["save_steps"] = args.get("eval_steps") or args.get("logging_steps") or 500
    elif checkpoint:  # nothing evaluates: save at each quarter of the run (else each epoch)
        steps = int(args.get("max_steps") or 0)
        args.update(save_total_limit=1, save_only_model=False,
                    **({"save_strategy": "steps", "save_steps": max(1, steps // 4)}
                       if steps > 0 else {"save_strategy": "epoch"}))
    return args


def pack(folder: Path) -> dict[str, Any]:
    """A checkpoint folder as ``report``'s ``checkpoint``: its name and every file's
    bytes by its path in the folder."""
    files = {str(p.relative_to(folder)): p.read_bytes()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return {"folder": folder.name, "files": files}


def unpack(path: str | Path, into: str | Path) -> Path:
    """Write back the checkpoint folder :func:`pack` made (saved with ``torch.save`` at
    ``path``, as sweeps hands it back) inside ``into``; returns the folder."""
    state = torch.load(path, weights_only=False)  # this trial's own state file
    folder = Path(into) / Path(str(state["folder"])).name
    for name, data in state["files"].items():
        target = (folder / name).resolve()
        if not target.is_relative_to(folder.resolve()):
            raise ValueError(f"checkpoint file {name!r} lies outside its folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return folder


def compile_args(mode: str | bool | None) -> dict[str, Any]:
    """``TrainingArguments`` fields for a sweeps compile mode (the ``compile`` knob's
    ``none``, ``default``, ``reduce-overhead``, ``max-autotune``).

    Example:
        >>> compile_args("none"), compile_args("max-autotune")
        ({'torch_compile': False}, {'torch_compile': True, 'torch_compile_mode': 'max-autotune'})
    """
    mode = sweeps_compile_mode(mode)
    return {"torch_compile": False} if mode == "none" else \
        {"torch_compile": True, "torch_compile_mode": mode}


def lr_scheduler(config: Mapping[str, Any], optimizer: torch.optim.Optimizer, *,
                 section: str | None = "training_args") -> Any:
    """The LR schedule ``Trainer`` builds from ``config[section]`` over the trial's steps.

    The preflight schedule hook (``preflight: {scheduler:
    sweeps.integrations.huggingface:lr_scheduler}`` in the sweep file): a
    ``lr_scheduler_type`` with warm restarts or a schedule that ends at zero too early is
    found before any trial runs.
    """
    from transformers import TrainingArguments, get_scheduler

    with tempfile.TemporaryDirectory(prefix="sweeps-hf-") as output_dir:
        args = TrainingArguments(**sweep_training_args(config, output_dir, section=section,
                                                       evaluate=False))
    steps = args.max_steps
    return get_scheduler(args.lr_scheduler_type, optimizer=optimizer,
                         num_warmup_steps=args.get_warmup_steps(steps), num_training_steps=steps,
                         scheduler_specific_kwargs=args.lr_scheduler_kwargs)


def lr_scheduler_flat(config: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> Any:
    """:func:`lr_scheduler` of one flat args file (``section=None``), for the preflight
    hook: ``preflight: {scheduler: sweeps.integrations.huggingface:lr_scheduler_flat}``."""
    return lr_scheduler(config, optimizer, section=None)


def train_hf(config: Mapping[str, Any], report: Report, *, train_dataset: Any,
             eval_dataset: Any = None, model: Any = None,
             model_init: Callable[[], Any] | None = None,
             section: str | None = "training_args",
             compile_mode: str | bool | None = None, trainer_class: type | None = None,
             checkpoint: bool = True, **trainer_kwargs: Any) -> Any:
    """Run one sweeps trial as a ``transformers.Trainer`` training; returns the Trainer.

    ``TrainingArguments`` come from ``config[section]`` through
    :func:`sweep_training_args`, so a sweep's ``write_back`` paths are its fields
    (``training_args.learning_rate``, ``.max_grad_norm``, ``.weight_decay``,
    ``.warmup_steps``); ``section=None``: from the config's top-level keys that are
    ``TrainingArguments`` fields (a flat ``HfArgumentParser`` args file). Prefer
    ``model_init`` (called after the trial's seed is set) to ``model``. ``compile_mode``:
    a ``compile`` knob's value, kept outside the section (TrainingArguments has no
    ``none`` mode), set as :func:`compile_args`.
    ``trainer_kwargs`` go to the Trainer (``data_collator``, ``processing_class``,
    ``compute_metrics``, ``callbacks``, ...); ``trainer_class`` is a Trainer subclass of
    yours. With an ``eval_dataset``, ``val_loss`` is reported at least at the last step.
    ``checkpoint``: the Trainer saves at each evaluation (without an ``eval_dataset``, at
    each quarter of the run) and sweeps keeps the last save, so a trial whose worker died
    resumes from it (``resume_from_checkpoint``) instead of from step 0; ``False`` for a
    model too large to save that often.

    Example (a trainer for a sweep file's ``trainer: train:train``)::

        def train(config, report):
            train_hf(config, report, model_init=lambda: build_model(config["model"]),
                     train_dataset=train_set, eval_dataset=val_set)
    """
    from transformers import PrinterCallback, Trainer, TrainingArguments

    callback = SweepsCallback(report, checkpoint=checkpoint)
    callbacks = [*(trainer_kwargs.pop("callbacks", None) or []), callback]
    restored = (config.get("sweep") or {}).get("checkpoint")  # a retried trial's last save
    with tempfile.TemporaryDirectory(prefix="sweeps-hf-") as output_dir:
        values = sweep_training_args(config, output_dir, section=section,
                                     evaluate=eval_dataset is not None, checkpoint=checkpoint)
        if compile_mode is not None:
            values.update(compile_args(compile_mode))
        args = TrainingArguments(**values)
        trainer = (trainer_class or Trainer)(
            model=model, model_init=model_init, args=args, train_dataset=train_dataset,
            eval_dataset=eval_dataset, callbacks=callbacks, **trainer_kwargs)
        trainer.remove_callback(PrinterCallback)  # logs stay in trainer.state.log_history
        resume = str(unpack(restored, Path(output_dir) / "restored")) if restored else None
        with _quiet_bars(bool(values.get("disable_tqdm"))):  # checkpoints' "Writing ..." bars
            trainer.train(resume_from_checkpoint=resume)
            if eval_dataset is not None and callback.last_val_step != trainer.state.global_step:
                trainer.evaluate()  # transformers versions that do not evaluate at the end
    return trainer


@contextlib.contextmanager
def _quiet_bars(quiet: bool) -> Iterator[None]:
    """transformers' own progress bars (a checkpoint's "Writing model shards") off inside
    the block when ``quiet``, as they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if quiet and was_on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was_on:
            hf_logging.enable_progress_bar()
