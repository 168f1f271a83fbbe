"""PyTorch Lightning: a callback that reports to sweeps, and a ``train(config, report)`` adapter.

A Lightning user's trainer module can be this short::

    from sweeps.integrations.lightning import fit

    def train(config, report):
        fit(config, report, module=MyModule, data=MyDataModule)

or keep its own ``Trainer`` and add ``SweepsCallback(report)`` to its callbacks.
When a rule fires, ``report`` raises :class:`~sweeps.trial.reporter.TrialStopped`
inside a hook; Lightning treats it like any exception (``on_exception`` hooks, loggers
finalised as failed, its internal teardown) and re-raises it out of ``Trainer.fit``, so
the trial ends on that step with the verdict. See docs/lightning.md.

This module imports Lightning (``pip install 'sweeps[lightning]'``); ``import sweeps``
does not.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import ClusterEnvironment, LightningEnvironment
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("sweeps.integrations.lightning needs Lightning 2.x: "
                      "pip install 'sweeps[lightning]'") from exc

from sweeps.trial.monitor import Monitor, is_class_labels, spread
from sweeps.trial.reporter import TrialStopped

Report = Callable[..., None]  # report(metrics, checkpoint=None)

#: ``Trainer`` arguments of a sweep trial unless ``fit`` is given others: no checkpoint
#: files, loggers, progress bars or model summaries per trial.
QUIET: dict[str, Any] = {"enable_checkpointing": False, "logger": False,
                         "enable_progress_bar": False, "enable_model_summary": False}


class SweepsCallback(pl.Callback):
    """Calls ``report`` once per optimizer step and after each validation.

    A step's report (from ``on_train_batch_end`` of its last micro-batch) has ``step``
    (``trainer.global_step``), ``loss`` (the step's training loss: what ``training_step``
    returned, averaged over accumulated micro-batches), ``grad_norm``, ``nonfinite_grads``
    and ``dead_params`` measured in ``on_before_optimizer_step`` (before Lightning clips)
    by :meth:`Monitor.grad_stats <sweeps.trial.monitor.Monitor.grad_stats>`, ``lr`` (the
    LR in the first optimizer's first param group for this step), ``clipped`` when the
    ``Trainer`` clips, and ``step_time`` (and ``compile_s``, the first step's time, when
    ``torch.compile`` wraps the model or a part of it). ``pred_std`` and ``target_std``
    are added when ``training_step`` returns ``{"loss": ..., "pred": ..., "target": ...}``.

    After each validation (not the sanity check) it reports ``val_loss`` from
    ``trainer.callback_metrics[val_key]`` at the current ``global_step``; with
    ``checkpoint`` that report also hands sweeps the Trainer's full checkpoint (what
    ``Trainer.save_checkpoint`` writes: weights, optimizer, schedulers, loop state), so a
    trial whose worker died resumes from it (:func:`fit` passes it back as ``ckpt_path``).

    Args:
        report: the ``report`` the trainer function received.
        val_key: the logged metric reported as ``val_loss`` (``self.log(val_key, ...)``).
        metrics: more ``callback_metrics`` keys to report after each validation.
        checkpoint: hand over a checkpoint with each validation's report.
    """

    def __init__(self, report: Report, *, val_key: str = "val_loss",
                 metrics: Sequence[str] = (), checkpoint: bool = False) -> None:
        self.report = report
        self.val_key = val_key
        self.metrics = tuple(metrics)
        self.checkpoint = checkpoint
        #: ``global_step`` of the last validation reported (None: none yet).
        self.last_val_step: int | None = None
        self._monitor: Monitor | None = None
        self._monitor_key: tuple[Any, ...] = ()
        self._pending: dict[str, float] | None = None  # grad metrics of this step
        self._losses: list[torch.Tensor] = []
        self._started: float | None = None
        self._step_time: float | None = None
        self._first_step = True
        self._warned = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pending, self._losses, self._started, self.last_val_step = None, [], None, None
        self._monitor, self._first_step = None, True

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._started is None:  # the first micro-batch of this optimizer step
            self._started = time.perf_counter()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Grads after backward (unscaled under AMP), before clipping and the step."""
        clip = clip_value(trainer.gradient_clip_val)
        by_norm = trainer.gradient_clip_algorithm in (None, "norm")
        first = trainer.optimizers[0] if trainer.optimizers else optimizer
        metrics = self._monitor_for(pl_module, first, clip if by_norm else None).measure()
        if clip is not None and not by_norm:  # clip by value: did any element exceed it?
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            peak = max((float(g.detach().abs().max()) for g in grads), default=0.0)
            metrics["clipped"] = 1.0 if peak > clip else 0.0
        self._pending = metrics

    def _monitor_for(self, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer,
                     clip: float | None) -> Monitor:
        """One Monitor per fit, built again only when the optimizer, the clip or the set of
        trainable parameters changed (a layer unfrozen while fine-tuning)."""
        trainable = sum(1 for p in pl_module.parameters() if p.requires_grad)
        key = (id(pl_module), id(optimizer), clip, trainable)
        if self._monitor is None or key != self._monitor_key:
            self._monitor, self._monitor_key = Monitor(pl_module, optimizer, grad_clip=clip), key
        return self._monitor

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs if isinstance(outputs, torch.Tensor) else (
            outputs.get("loss") if isinstance(outputs, Mapping) else None)
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
        if self._pending is None:  # a micro-batch of an accumulated step, or a skipped one
            return
        metrics: dict[str, Any] = {"step": trainer.global_step, **self._pending}
        if self._losses:
            # automatic optimization divides each micro-batch's loss by the accumulation
            # count before handing it here, so their sum is the step's mean loss
            total = sum(t.float() for t in self._losses) if pl_module.automatic_optimization \
                else self._losses[-1]
            metrics["loss"] = float(total)
        target = outputs.get("target") if isinstance(outputs, Mapping) else None
        if isinstance(target, torch.Tensor) and is_class_labels(target) and \
                self._monitor is not None:  # the random guess of unequal class frequencies
            metrics.update(self._monitor.label_guess(target))
        if isinstance(outputs, Mapping) and isinstance(outputs.get("pred"), torch.Tensor):
            if not (isinstance(target, torch.Tensor) and is_class_labels(target)):
                metrics["pred_std"] = spread(outputs["pred"])
                if isinstance(target, torch.Tensor):
                    metrics["target_std"] = spread(target)
        now = time.perf_counter()
        self._step_time = now - (self._started if self._started is not None else now)
        metrics["step_time"] = self._step_time
        if self._first_step and _is_compiled(trainer, pl_module):
            metrics["compile_s"] = self._step_time  # the first step compiles
        self._pending, self._losses, self._started, self._first_step = None, [], None, False
        self.report(metrics)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        found = trainer.callback_metrics
        if self.val_key not in found:
            if not self._warned:
                self._warned = True
                warnings.warn(f"SweepsCallback: no {self.val_key!r} in trainer.callback_metrics "
                              f"after validation (logged: {sorted(found)}); log it with "
                              f"self.log({self.val_key!r}, loss) or pass val_key=...",
                              stacklevel=2)
            # what validation did log, under its own names: an objective never reported
            # is then told with the closest of them (val_key='val/mse')
            logged = {k: v for k, v in ((k, _scalar(v)) for k, v in found.items())
                      if v is not None}
            if logged:
                self.report({"step": trainer.global_step, **logged})
            return
        metrics: dict[str, Any] = {"step": trainer.global_step,
                                   "val_loss": float(found[self.val_key])}
        metrics.update({k: float(found[k]) for k in self.metrics if k in found})
        if self._step_time is not None:  # keep validation time out of the step time
            metrics["step_time"] = self._step_time
        self.last_val_step = trainer.global_step
        if self.checkpoint:
            self.report(metrics, checkpoint=_checkpoint_of(trainer))
        else:
            self.report(metrics)


def _scalar(value: Any) -> float | None:
    """A logged value as a float; None for one that is not a single number."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def clip_value(value: Any) -> float | None:
    """A ``gradient_clip_val`` as Lightning should get it: ``0``, ``None`` or ``False`` is
    no clipping (``None``), never a clip to zero.

    Example:
        >>> clip_value(0), clip_value(None), clip_value(1), clip_value("0.5")
        (None, None, 1.0, 0.5)
    """
    if value is None or value is False:
        return None
    clip = float(value)
    if clip < 0:
        raise ValueError(f"gradient_clip_val must be >= 0 (0 = no clipping), got {value!r}")
    return clip or None


def device_args(device: str) -> dict[str, Any]:
    """``Trainer`` ``accelerator`` and ``devices`` for a trial's ``config["sweep"]["device"]``.

    Example:
        >>> device_args("cpu"), device_args("cuda:1")
        ({'accelerator': 'cpu', 'devices': 1}, {'accelerator': 'gpu', 'devices': [1]})
    """
    kind, _, index = str(device).partition(":")
    if kind == "cuda":
        return {"accelerator": "gpu", "devices": [int(index or 0)]}
    return {"accelerator": kind, "devices": 1}


def trainer_args(config: Mapping[str, Any], *, trainer_key: str = "trainer",
                 **overrides: Any) -> dict[str, Any]:
    """The ``Trainer`` arguments of a trial: ``config[trainer_key]`` (the user's own), then
    :data:`QUIET`, then ``overrides``, then what the sweep decides.

    ``gradient_clip_val`` 0 becomes ``None``; a callback given as a LightningCLI
    ``class_path``/``init_args`` mapping is built (:func:`from_class_path`). With a
    ``sweep`` section (inside a sweep)
    the budget and the device are the sweep's: ``max_steps`` from it, ``max_epochs=-1``,
    no ``max_time``, ``accelerator``/``devices`` from its ``device``, and a plain
    ``LightningEnvironment`` unless a cluster environment is given: a trial is one process
    on one device placed by Ray, whatever SLURM variables the worker inherited.
    """
    section = config.get(trainer_key) or {}
    if not isinstance(section, Mapping):
        raise TypeError(f"config[{trainer_key!r}] must be a mapping of Trainer arguments, "
                        f"not {type(section).__name__}")
    kwargs = {**section, **QUIET, **overrides}
    kwargs["gradient_clip_val"] = clip_value(kwargs.get("gradient_clip_val"))
    if isinstance(kwargs.get("callbacks"), (list, tuple)):  # a LightningCLI config's
        kwargs["callbacks"] = [from_class_path(c, f"{trainer_key}.callbacks.{i}")
                               for i, c in enumerate(kwargs["callbacks"])]
    sweep = config.get("sweep")
    if sweep:
        kwargs.update(max_steps=int(sweep["max_steps"]), max_epochs=-1, max_time=None,
                      **device_args(sweep.get("device") or "cpu"))
        plugins = kwargs.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(
            plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, ClusterEnvironment) for p in plugins):
            plugins.append(LightningEnvironment())
        kwargs["plugins"] = plugins
    return kwargs


def fit(config: Mapping[str, Any], report: Report, module: Any, data: Any = None, *,
        model_key: str = "model", data_key: str = "data", trainer_key: str = "trainer",
        val_key: str = "val_loss", metrics: Sequence[str] = (), checkpoint: bool = True,
        **trainer_kwargs: Any) -> pl.Trainer:
    """Train a LightningModule as one sweep trial; returns the ``Trainer``.

    Seeds everything from ``config["sweep"]["seed"]``, builds the module and data, then
    ``Trainer(**trainer_args(config, ...), callbacks=[..., SweepsCallback(report)])``
    and ``trainer.fit``. When the budget ends between Lightning's own validations, one
    more ``trainer.validate`` reports the final ``val_loss``. Lightning's info log lines
    are off meanwhile.

    Args:
        config: the trial's config (your base config with the knob values merged in).
        report: the ``report`` your ``train`` received.
        module: a LightningModule class (built as ``module(**config[model_key])``), a
            function ``config -> LightningModule``, or an instance.
        data: the same for a LightningDataModule (``config[data_key]``), or None when the
            module has its own dataloaders.
        checkpoint: hand sweeps the Trainer's checkpoint with each validation's report
            (as Ray Tune's own Lightning callback does), so a trial whose worker died is
            retried from its last validation (``config["sweep"]["checkpoint"]``, given to
            ``trainer.fit`` as ``ckpt_path``) instead of from step 0. ``False`` for a
            model too large to save that often.
        trainer_kwargs: more ``Trainer`` arguments; they win over ``config[trainer_key]``
            and :data:`QUIET`, not over the sweep's budget and device.

    A rule's verdict ends ``trainer.fit`` with :class:`TrialStopped` (Ray stopping the
    trial, with ``SystemExit``); the module's, datamodule's and callbacks' ``teardown``
    hooks (which Lightning skips after an exception) are then run before it propagates,
    so a worker that runs trial after trial releases what they hold.
    """
    sweep = config.get("sweep") or {}
    pl.seed_everything(int(sweep.get("seed", 0)), workers=True, verbose=False)
    model = _build(module, config, model_key, pl.LightningModule)
    datamodule = None if data is None else _build(data, config, data_key, pl.LightningDataModule)
    callback = SweepsCallback(report, val_key=val_key, metrics=metrics, checkpoint=checkpoint)
    resume = sweep.get("checkpoint")  # the state a retried trial continues from
    kwargs = trainer_args(config, trainer_key=trainer_key, **trainer_kwargs)
    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
    with _info_logs_off():
        trainer = pl.Trainer(**kwargs)
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=resume or None)
            if callback.last_val_step != trainer.global_step and _validates(model, datamodule):
                trainer.validate(model, datamodule=datamodule, verbose=False)
        except (TrialStopped, SystemExit):  # a verdict, or Ray ending the trial (ASHA)
            _teardown_hooks(trainer)
            raise
    return trainer


def linear_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int) -> dict[str, Any]:
    """An ``lr_scheduler`` entry for ``configure_optimizers``: the LR rises linearly to the
    optimizer's LR over ``warmup_steps`` optimizer steps (``lr / warmup_steps`` on the
    first), then stays; stepped every optimizer step (``interval: step``).

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = linear_warmup(opt, 4)["scheduler"]
        >>> lrs = []
        >>> for _ in range(6):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
        >>> lrs
        [0.025, 0.05, 0.075, 0.1, 0.1, 0.1]
    """
    steps = max(0, int(warmup_steps or 0))

    def factor(step: int) -> float:  # step = optimizer steps done so far
        return min(1.0, (step + 1) / steps) if steps else 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"scheduler": scheduler, "interval": "step", "frequency": 1}


def _checkpoint_of(trainer: pl.Trainer) -> dict[str, Any]:
    """The checkpoint ``trainer.save_checkpoint`` would write, as a dict (sweeps saves it
    with ``torch.save``, which is how Lightning writes and reads its own files)."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


@contextmanager
def _info_logs_off() -> Iterator[None]:
    """Lightning's info lines (devices found, tips, "max_steps reached") off for a trial;
    its warnings stay, but for the hint to launch with ``srun`` on a machine that has it
    (a trial is one process Ray placed, whether or not SLURM runs the sweep)."""
    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=SRUN_HINT)
            yield
    finally:
        log.setLevel(level)


#: The start of Lightning's warning on a machine with SLURM's ``srun`` (``SLURMEnvironment``).
SRUN_HINT = "The `srun` command is available on your system but is not used"


def _is_compiled(trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
    """Whether ``torch.compile`` wraps the model (``Trainer.fit(torch.compile(module))``)
    or a part of it (compiled in ``configure_model``)."""
    from torch._dynamo import OptimizedModule

    return isinstance(trainer.strategy.model, OptimizedModule) or any(
        isinstance(m, OptimizedModule) for m in pl_module.modules())


def from_class_path(entry: Any, where: str) -> Any:
    """``entry`` itself, or the object a LightningCLI ``class_path``/``init_args`` mapping
    describes (``where``: its key path, for the error).

    Example:
        >>> from_class_path({"class_path": "datetime.timedelta", "init_args": {"days": 2}},
        ...                 "trainer.callbacks.0").days
        2
    """
    if not isinstance(entry, Mapping) or "class_path" not in entry:
        return entry
    import importlib

    module, _, name = str(entry["class_path"]).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImportError(f"{where}: class_path {entry['class_path']!r} names no class "
                          f"sweeps could import ({exc})") from exc
    return cls(**dict(entry.get("init_args") or {}))


def _build(obj: Any, config: Mapping[str, Any], key: str, kind: type) -> Any:
    """An instance of ``kind``: ``obj`` itself, ``obj(**config[key])`` for a class, or
    ``obj(config)`` for a factory."""
    if isinstance(obj, kind):
        return obj
    if isinstance(obj, type):
        section = config.get(key) or {}
        if not isinstance(section, Mapping):
            raise TypeError(f"config[{key!r}] must be a mapping of {obj.__name__} arguments")
        return obj(**section)
    if callable(obj):
        return obj(config)
    raise TypeError(f"expected a {kind.__name__}, its class or a function config -> "
                    f"{kind.__name__}, got {type(obj).__name__}")


def _validates(model: pl.LightningModule, datamodule: Any) -> bool:
    """Whether ``trainer.validate`` has a ``validation_step`` and a val dataloader."""
    if not is_overridden("validation_step", model):
        return False
    return is_overridden("val_dataloader", model) or (
        datamodule is not None and is_overridden("val_dataloader", datamodule))


def _teardown_hooks(trainer: pl.Trainer) -> None:
    """The ``teardown`` hooks a finished ``fit`` would run; a failing one is a warning, so
    the verdict being raised is kept."""
    stage = trainer.state.fn
    module = trainer.lightning_module
    if stage is None or module is None:
        return
    hooks: list[Callable[[], None]] = []
    if trainer.datamodule is not None:
        hooks.append(lambda: trainer.datamodule.teardown(stage=stage))
    hooks += [lambda cb=cb: cb.teardown(trainer, module, stage=stage) for cb in trainer.callbacks]
    hooks.append(lambda: module.teardown(stage=stage))
    for hook in hooks:
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - the verdict matters more than the teardown
            warnings.warn(f"teardown after a sweeps stop failed: {exc!r}", stacklevel=2)
