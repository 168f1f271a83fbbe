"""Per-step training metrics measured at the one moment they are true.

The grad norm is read after ``loss.backward()`` and *before* clipping and
``zero_grad`` (a norm read afterwards is the clipped value, or 0.0), and the
LR is the one actually in the optimizer, not the one the config asked for.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Iterable

import torch


class Monitor:
    """Measures what the instability rules need, once per optimizer step.

    Args:
        model: the module being trained, or an iterable of its parameters.
        optimizer: the optimizer whose first param group's LR is reported.
            Optional; without it no ``lr`` is reported.
        grad_clip: the clip threshold the loop applies, if any. When above 0,
            ``clipped`` (1.0 or 0.0) says whether this step's norm exceeded it. 0 or
            None mean no clipping, as in the shipped search spaces: call
            :meth:`clip` (which does nothing then), or skip ``clip_grad_norm_`` at 0
            yourself, since ``clip_grad_norm_(params, 0)`` scales every gradient to
            zero. With an ``optimizer``, a step whose gradients were all zeroed after
            :meth:`measure` saw them (a clip to 0) is reported as ``zeroed_grads`` 1.0
            with a warning.

    Example:
        >>> model = torch.nn.Linear(3, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, opt, grad_clip=1.0)
        >>> x, y = torch.ones(4, 3), torch.zeros(4, 1)
        >>> loss = torch.nn.functional.mse_loss(model(x), y)
        >>> loss.backward()
        >>> metrics = monitor.measure(loss)      # before clipping and zero_grad
        >>> sorted(metrics)
        ['clipped', 'dead_params', 'grad_norm', 'loss', 'lr', 'nonfinite_grads']
    """

    def __init__(
        self,
        model: torch.nn.Module | Iterable[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer | None = None,
        *,
        grad_clip: float | None = None,
    ) -> None:
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        self._params = [p for p in params if p.requires_grad]
        self._optimizer = optimizer
        if grad_clip is not None and not grad_clip >= 0:
            raise ValueError(f"grad_clip={grad_clip!r}: a clip threshold is >= 0 (0 or None: "
                             "no clipping)")
        self._grad_clip = float(grad_clip) if grad_clip else None
        self._measured_norm = 0.0  # the last measure's norm, checked when the step runs
        self._zeroed = False
        self._warned = False
        self._hooked = False  # the optimizer's step tells the monitor when a step ran
        self._clip_unstepped = False  # clip() ran, and no optimizer step since
        self._label_counts: torch.Tensor | None = None  # class labels seen by measure()
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds one
        if isinstance(inner, torch.optim.Optimizer):
            self._hooked = True
            ref = weakref.ref(self)

            def before_step(*_: object) -> None:
                monitor = ref()
                if monitor is not None:
                    monitor._before_step()

            handle = inner.register_step_pre_hook(before_step)
            weakref.finalize(self, handle.remove)  # a Monitor per step piles up no hooks

    def clip(self) -> float | None:
        """Clip the gradients to ``grad_clip`` (nothing when it is 0 or None); the total
        norm before clipping, or None when it did not clip."""
        if self._grad_clip is None:
            return None
        norm = float(torch.nn.utils.clip_grad_norm_(self._params, self._grad_clip))
        # a GradScaler skips optimizer.step() when the gradients hold inf/NaN: no step is due
        self._clip_unstepped = self._hooked and math.isfinite(norm)
        return norm

    def _before_step(self, *_: object) -> None:
        """Optimizer step pre-hook: were the gradients measured non-zero all zeroed since?"""
        self._clip_unstepped = False
        if not self._measured_norm > 0 or not math.isfinite(self._measured_norm):
            return
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads and all(not bool(g.any()) for g in grads):
            self._zeroed = True
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"every gradient was zero at optimizer.step() although Monitor measured "
                    f"a grad norm of {self._measured_norm:.3g}: something scaled them to zero "
                    "in between, e.g. clip_grad_norm_(params, 0); 0 means no clipping in "
                    "the search spaces: skip the clip at 0 or call monitor.clip()",
                    RuntimeWarning, stacklevel=3)

    def grad_stats(self) -> tuple[float, int, int]:
        """Total L2 grad norm, non-finite grad element count, dead parameter count."""
        grads = [p.grad for p in self._params if p.grad is not None]
        missing = len(self._params) - len(grads)
        if not grads:
            return 0.0, 0, missing
        per_tensor = torch._foreach_norm([g.detach() for g in grads])
        norms = torch.stack([n.float() for n in per_tensor])
        total = float(torch.linalg.vector_norm(norms).item())
        dead = missing + int((norms == 0).sum().item())
        nonfinite = 0
        if not math.isfinite(total):
            nonfinite = int(sum((~torch.isfinite(g)).sum().item() for g in grads))
        return total, nonfinite, dead

    def frozen_params(self) -> int:
        """Parameter tensors the optimizer holds whose ``requires_grad`` is False: they
        get no gradient, so they never train (``dead_params`` counts only the trainable
        ones); a backbone frozen by accident shows here."""
        if self._optimizer is None:
            return 0
        groups = getattr(self._optimizer, "param_groups", None) or []
        return sum(isinstance(p, torch.Tensor) and not p.requires_grad
                   for group in groups for p in group.get("params", []))

    def lr(self) -> float | None:
        """The LR in the optimizer's first param group right now."""
        if self._optimizer is None:
            return None
        return float(self._optimizer.param_groups[0]["lr"])

    def measure(
        self,
        loss: torch.Tensor | float | None = None,
        *,
        pred: torch.Tensor | None = None,
        target: torch.Tensor | None = None,
        lr: float | None = None,
    ) -> dict[str, float]:
        """Metrics for this step. Call after ``backward()``, before clip and ``zero_grad``.

        ``pred`` and ``target`` add ``pred_std`` and ``target_std``: the std over
        the batch, averaged over outputs (the collapse rule compares them). They are
        for continuous outputs (regression, directions, embeddings). Class labels
        (an integer ``target``) get neither: a classifier that collapses onto one
        class sits at the random-guess loss, which flat_at_baseline catches, while a
        healthy one predicting mostly the frequent classes early on is no collapse.
        Instead they add ``label_entropy`` and ``label_majority``: the cross-entropy
        (nats) of predicting the frequencies of the labels seen so far, and the most
        frequent label's share (negative labels, an ``ignore_index``, left out): the
        random guess of a classifier whose classes are not equally frequent, which
        flat_at_baseline uses when it is below ``rules.baseline_loss``.

        ``grads_absent`` (1.0, only then) says that no parameter had a gradient at all:
        ``measure`` ran after ``optimizer.zero_grad()`` or before ``backward()``, which
        sweeps tells apart from a dead model (gradients there, and all zero).

        ``lr``: the LR this step uses, for a loop that updates the parameters itself
        (``p.data.add_(p.grad, alpha=-lr)``) and has no optimizer to read it from; it
        wins over the optimizer's.
        """
        metrics: dict[str, float] = {}
        if self._zeroed:  # the previous step ran on zeroed gradients
            metrics["zeroed_grads"] = 1.0
            self._zeroed = False
        if self._clip_unstepped:  # clip() before measure(): the clipped norm is measured
            metrics["clipped_before_measure"] = 1.0
            self._clip_unstepped = False
        if loss is not None:
            metrics["loss"] = float(loss.detach().item() if torch.is_tensor(loss) else loss)
        grad_norm, nonfinite, dead = self.grad_stats()
        metrics["grad_norm"] = grad_norm
        metrics["nonfinite_grads"] = float(nonfinite)
        metrics["dead_params"] = float(dead)
        frozen = self.frozen_params()
        if frozen:
            metrics["frozen_params"] = float(frozen)
        if self._params and dead == len(self._params) and \
                all(p.grad is None for p in self._params):  # looked for only when all dead
            metrics["grads_absent"] = 1.0  # after zero_grad(), or before backward()
        self._measured_norm = grad_norm
        lr = float(lr) if lr is not None else self.lr()
        if lr is not None:
            metrics["lr"] = lr
        if self._grad_clip is not None:
            metrics["clipped"] = 1.0 if grad_norm > self._grad_clip else 0.0
        if target is not None and is_class_labels(target):
            metrics.update(self.label_guess(target))
            return metrics
        if pred is not None:
            metrics["pred_std"] = spread(pred)
        if target is not None:
            metrics["target_std"] = spread(target)
        return metrics

    def label_guess(self, target: torch.Tensor) -> dict[str, float]:
        """``label_entropy`` and ``label_majority`` of the class labels seen so far,
        ``target``'s included (negative labels, an ``ignore_index``, left out): for an
        integration that sees the labels apart from :meth:`measure`."""
        labels = target.detach().reshape(-1).long()
        labels = labels[labels >= 0].cpu()
        if labels.numel() == 0:
            return {}
        counts = torch.bincount(labels).double()
        seen = self._label_counts
        if seen is not None:
            size = max(seen.numel(), counts.numel())
            counts = torch.nn.functional.pad(counts, (0, size - counts.numel())) + \
                torch.nn.functional.pad(seen, (0, size - seen.numel()))
        self._label_counts = counts
        share = counts[counts > 0] / counts.sum()
        return {"label_entropy": float(-(share * share.log()).sum()),
                "label_majority": float(share.max())}


def is_class_labels(target: torch.Tensor) -> bool:
    """Whether ``target`` holds class indices (an integer or bool tensor)."""
    return not (target.is_floating_point() or target.is_complex())


def spread(values: torch.Tensor) -> float:
    """Std over the batch (first dim), averaged over outputs.

    A model that predicts one constant per output has spread 0 even when the
    constants differ between outputs.
    """
    v = values.detach().float()
    if v.ndim < 2 or v.shape[0] < 2:
        return float(v.std().item()) if v.numel() > 1 else 0.0
    return float(v.reshape(v.shape[0], -1).std(dim=0).mean().item())
