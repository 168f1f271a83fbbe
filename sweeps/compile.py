"""Applying a ``torch.compile`` mode named in a config."""

from __future__ import annotations

import torch

#: Compile modes a search space may name. ``none`` means eager execution.
COMPILE_MODES: tuple[str, ...] = ("none", "default", "reduce-overhead", "max-autotune")


def compile_model(model: torch.nn.Module, mode: str | bool | None) -> torch.nn.Module:
    """Return ``model`` compiled with ``mode``, or unchanged for ``none``/``False``/``None``.

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> compile_model(m, "none") is m
        True
    """
    if mode in (None, False, "none", "false", ""):
        return model
    if mode is True:
        mode = "default"
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {mode!r}; choose one of {COMPILE_MODES}")
    return torch.compile(model, mode=None if mode == "default" else mode)
