"""Classifying an exception a trainer raised into a failure reason."""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from sweeps.rules.verdict import Verdict

try:
    import posix
except ImportError:  # Windows
    posix = None  # type: ignore[assignment]

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


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line: the message's first line (its summary), and its last
    after `` … `` when it has more (a wrapped error ends with the one it wraps).

    Example:
        >>> error_line(RuntimeError("bad dropout config: 0.4\\n---\\nkey: value"))
        'RuntimeError: bad dropout config: 0.4 … key: value'
        >>> error_line(KeyError("lr"))
        "KeyError: 'lr'"
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1 and lines[-1] != lines[0]:
        text = f"{text[:limit // 2]} … {lines[-1]}"
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__


def format_exception(exc: BaseException, limit: int = 20_000) -> str:
    """The full traceback, trimmed from the front to ``limit`` characters."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]


class TrainerExit(BaseException):  # noqa: N818 - mirrors SystemExit
    """``os._exit(code)`` called by a trainer, turned into an exception in its thread."""

    def __init__(self, code: int) -> None:
        super().__init__(f"os._exit({code})")
        self.code = code


_REAL_EXIT = os._exit
#: (process, thread) running a trainer: ``os._exit`` called from one of them raises
#: instead. The process counts: a child forked from that thread (a DataLoader worker)
#: keeps the thread's id, and its own ``os._exit`` at its end must end it.
_GUARDED: set[tuple[int, int]] = set()


def _guarded_exit(code: int) -> None:
    if (os.getpid(), threading.get_ident()) in _GUARDED:
        raise TrainerExit(int(code))
    _REAL_EXIT(code)


def install_exit_guard() -> None:
    """Replace ``os._exit`` (and ``posix._exit``) for the whole process, before a trainer
    module is imported: a trainer that did ``from os import _exit`` then holds the guarded
    function too. Outside :func:`process_exit_raises` it is the real one."""
    os._exit = _guarded_exit
    if posix is not None:
        posix._exit = _guarded_exit


@contextmanager
def process_exit_raises() -> Iterator[None]:
    """Within the block, ``os._exit`` called from this thread raises :class:`TrainerExit`,
    however the trainer named it (``os._exit``, ``from os import _exit``, ``posix._exit``).

    A trainer that ends its process would otherwise kill the Ray worker, and the trial
    would be retried as if its node had been lost (and fail the same way each time).
    Other threads (Ray's own) keep the real ``os._exit``.
    """
    install_exit_guard()
    owner = (os.getpid(), threading.get_ident())
    _GUARDED.add(owner)
    try:
        yield
    finally:
        _GUARDED.discard(owner)


def exit_verdict(exc: SystemExit | TrainerExit, step: int) -> Verdict:
    """``trainer_exit`` for a trainer that called ``sys.exit`` or ``os._exit``."""
    if isinstance(exc, TrainerExit):
        code, call = exc.code, f"os._exit({exc.code})"
    else:
        code = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        call = f"sys.exit({exc.code!r})"
    return Verdict("trainer_exit", step, {
        "exit_code": 0 if code is None else code,
        "error": f"the trainer called {call}; return from train() instead (sweeps ends a "
                 "trial when train() returns or a rule stops it)"})
