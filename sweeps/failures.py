"""Classifying an exception a trainer raised into a failure reason."""

from __future__ import annotations

import traceback

_COMPILE_MARKERS = ("torch/_dynamo", "torch/_inductor", "triton", "BackendCompilerFailed",
                    "InductorError", "TorchRuntimeError")


def classify(exc: BaseException) -> str:
    """``oom``, ``compile_error`` or ``crash`` for an exception out of a trainer.

    Example:
        >>> classify(MemoryError())
        'oom'
        >>> classify(ValueError("bad shape"))
        'crash'
    """
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return "oom"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if "out of memory" in str(exc).lower():
        return "oom"
    name = type(exc).__module__ + "." + type(exc).__qualname__
    if name.startswith(("torch._dynamo", "torch._inductor")) or any(
            m in text for m in _COMPILE_MARKERS):
        return "compile_error"
    return "crash"


def format_exception(exc: BaseException, limit: int = 20_000) -> str:
    """The full traceback, trimmed from the front to ``limit`` characters."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]
