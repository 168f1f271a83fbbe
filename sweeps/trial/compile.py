"""Applying a ``torch.compile`` mode named in a config, and the evidence that it compiled."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a model is compiled, not by the CLI or rules
    import torch

#: Compile modes a search space may name. ``none`` means eager execution.
COMPILE_MODES: tuple[str, ...] = ("none", "default", "reduce-overhead", "max-autotune")

#: Keys of a trial's compile evidence (see :func:`compile_evidence`), as trials.csv columns
#: ``compile_<key>``.
EVIDENCE_KEYS: tuple[str, ...] = ("calls", "graphs", "recompiles", "graph_breaks",
                                  "eager_frames", "cache_hits", "cache_misses")

#: Models :func:`compile_model` compiled since :func:`reset_compiler` (the evidence's
#: ``calls``): whether the trainer asked for compiling at all, when no graph came of it.
_calls = 0


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
        >>> import torch
        >>> m = torch.nn.Linear(2, 2)
        >>> compile_model(m, "none") is m
        True
    """
    global _calls
    mode = compile_mode(mode)
    if mode == "none":
        return model
    import torch

    _calls += 1
    return torch.compile(model, mode=None if mode == "default" else mode)


def reset_compiler() -> None:
    """Start the next trial in this process from a clean compiler state.

    ``torch._dynamo.reset()`` drops the compiled code of earlier trials (whose entries
    count towards ``torch._dynamo.config.recompile_limit``, after which dynamo runs a
    function eagerly without a word), and the counters are cleared so that
    :func:`compile_evidence` speaks of this trial only. The on-disk caches (inductor's FX
    graph cache, AOTAutograd's cache) are kept: a graph compiled before is loaded from them.
    """
    global _calls
    _calls = 0
    if "torch._dynamo" not in sys.modules:  # nothing was compiled in this process
        return
    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, counters

    torch._dynamo.reset()
    counters.clear()
    clear_compilation_metrics()


def compile_evidence() -> dict[str, Any]:
    """What dynamo and inductor did since :func:`reset_compiler`, from their counters.

    ``graphs``: graphs compiled; ``recompiles``: compiles of a function compiled before
    (guards failed, e.g. ``grad_mode`` changed); ``graph_breaks``; ``eager_frames``:
    functions dynamo gave up on and ran eagerly (recompile limit, unsupported code, a
    compile error it suppressed); ``cache_hits`` / ``cache_misses``: inductor's FX graph
    cache; ``limit``: the recompile-limit message with its last reason, if it was hit;
    ``error``: the first failure dynamo swallowed; ``calls``: models
    :func:`compile_model` was asked to compile.
    """
    if "torch._dynamo" not in sys.modules:  # nothing was compiled in this process
        return {**dict.fromkeys(EVIDENCE_KEYS, 0), "calls": _calls}  # the one count kept
    import torch._dynamo
    from torch._dynamo.utils import counters, get_compilation_metrics

    metrics = list(get_compilation_metrics())
    frames = counters["frames"]
    out: dict[str, Any] = {
        "calls": _calls,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "recompiles": sum(1 for m in metrics if m.recompile_reason),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "eager_frames": max(0, int(frames["total"]) - int(frames["ok"])),
        "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
    }
    for m in metrics:
        reason = str(m.fail_reason or "")
        if "recompile limit" in reason.lower() and "limit" not in out:
            last = str(m.recompile_reason or "").split(": ", 1)[-1].split("  #")[0].strip()
            out["limit"] = (f"recompile_limit ({torch._dynamo.config.recompile_limit}) hit"
                            + (f", last reason: {last}" if last else ""))
        elif reason and "error" not in out:
            out["error"] = f"{m.fail_type or 'error'}: {reason.splitlines()[0][:200]}"
    return out


def eager_fallback(mode: str | None, evidence: dict[str, Any] | None) -> str | None:
    """Why a trial labelled with compile ``mode`` did not run compiled, or None.

    A compiled label whose trial compiled no graph, hit the recompile limit or had a
    function fall back to eager ran (at least partly) eagerly; its step time is not
    that mode's speed.

    Example:
        >>> eager_fallback("default", {"graphs": 0})
        'no graph was compiled (the model ran eagerly)'
        >>> eager_fallback("none", {"graphs": 0}) is None
        True
    """
    if mode in (None, "none", False, "", "false"):
        return None
    ev = evidence or {}
    if ev.get("limit"):
        return f"{ev['limit']}: later calls ran eagerly"
    if not ev.get("graphs"):
        return "no graph was compiled (the model ran eagerly)"
    if ev.get("eager_frames"):
        why = f" ({ev['error']})" if ev.get("error") else ""
        return f"{ev['eager_frames']} function(s) fell back to eager{why}"
    return None
