"""Applying a ``torch.compile`` mode named in a config."""

from __future__ import annotations

import torch

#: Compile modes a search space may name. ``none`` means eager execution.
COMPILE_MODES: tuple[str, ...] = ("none", "default", "reduce-overhead", "max-autotune")


def compile_mode(value: str | bool | None, key: str = "compile") -> str:
    """A config's compile setting as one of :data:`COMPILE_MODES`.

    ``None``, ``False`` and ``""`` mean ``none``; ``True`` means ``default``.

    Example:
        >>> compile_mode(None), compile_mode(True), compile_mode("max-autotune")
        ('none', 'default', 'max-autotune')
    """
    if value in (None, False, "", "false"):
        return "none"
    if value is True:
        return "default"
    if value not in COMPILE_MODES:
        raise ValueError(f"{key}: unknown compile mode {value!r}; choose one of {COMPILE_MODES}")
    return str(value)


def compile_model(model: torch.nn.Module, mode: str | bool | None) -> torch.nn.Module:
    """Return ``model`` compiled with ``mode``, or unchanged for ``none``/``False``/``None``.

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> compile_model(m, "none") is m
        True
    """
    mode = compile_mode(mode)
    if mode == "none":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)
