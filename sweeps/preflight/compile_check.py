"""Which ``torch.compile`` modes work on this machine, tried on a tiny module.

On CPU each compiled mode is probed on the CPU and ``reduce-overhead`` (CUDA graphs) is
dropped. When the sweep asks for GPUs and CUDA is present, every compiled mode is probed
on the GPU: ``max-autotune`` needs Triton, and ``reduce-overhead`` must capture its CUDA
graphs (a skipped capture is an error in the probe, with torch's reason).
"""

from __future__ import annotations

import re
import subprocess
import sys

from sweeps.preflight.findings import Finding

#: Code run in a fresh interpreter per mode, so a crash or hang cannot take the driver down.
_PROBE = """
import sys, torch
from sweeps.trial.compile import compile_model
mode, device = sys.argv[1], sys.argv[2]
if device == "cuda":
    import torch._inductor.config
    torch._inductor.config.triton.cudagraph_or_error = True  # a skipped CUDA graph raises
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
model = compile_model(net.to(device), mode)
x = torch.randn(4, 8, device=device)
for _ in range(3):  # CUDA graph trees: warm-up, record, replay
    model(x).sum().backward()
if device == "cuda":
    torch.cuda.synchronize()
print("ok")
"""


def has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def probe_mode(mode: str, timeout: float = 300.0, device: str = "cpu") -> str | None:
    """None if ``mode`` compiles and runs a step on ``device`` (``cpu`` or ``cuda``) here,
    else the reason it does not."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, mode, device],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"compiling a tiny module took over {timeout:.0f} s"
    if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
        return None
    return error_line(proc.stderr) or f"exit code {proc.returncode}"


def error_line(stderr: str) -> str | None:
    """The last ``SomeError: message`` line of a traceback in ``stderr``."""
    pattern = re.compile(r"^[\w.]*(Error|Exception|Failed|Interrupt)\b.*:")
    lines = [ln.strip() for ln in stderr.splitlines()]
    hits = [ln for ln in lines if pattern.match(ln)]
    if hits:
        return hits[-1][:300]
    rest = [ln for ln in lines if ln]
    return rest[-1][:300] if rest else None


def check_modes(modes: list[str], *, gpu_requested: bool,
                timeout: float = 300.0) -> tuple[list[str], list[Finding]]:
    """The modes that can work here, a finding for each one dropped, and an ``info``
    finding naming the modes that compiled (a passing check left no trace)."""
    findings: list[Finding] = []
    usable: list[str] = []
    gpu = gpu_requested and has_gpu()
    for mode in modes:
        if mode == "none":
            usable.append(mode)
            continue
        if mode == "reduce-overhead" and not gpu:
            why = ("resources.gpu asks for GPUs but this machine, where preflight runs, has "
                   "no CUDA to probe it on") if gpu_requested else \
                "there is no GPU for the trials here, so it would only add compile time"
            findings.append(Finding(
                "compile", "warning", f"dropped 'reduce-overhead': it captures CUDA graphs "
                f"and {why}", "search it on a GPU machine (resources.gpu > 0; start the "
                "sweep where CUDA is present)", {"mode": mode}))
            continue
        reason = probe_mode(mode, timeout, "cuda" if gpu else "cpu")
        if reason is None:
            usable.append(mode)
        else:
            where = "on this machine's GPU" if gpu else "on this machine"
            findings.append(Finding(
                "compile", "warning", f"dropped '{mode}': it does not work {where} "
                f"({reason})", "install a working compiler toolchain (and Triton on GPU), or "
                "leave this mode out of the search space",
                {"mode": mode, "error": reason, "device": "cuda" if gpu else "cpu"}))
    probed = [m for m in usable if m != "none"]
    if probed:
        where = "this machine's GPU" if gpu else "this machine"
        findings.append(Finding(
            "compile", "info", f"torch.compile mode(s) {', '.join(map(repr, probed))} "
            f"compiled a small model on {where}: kept in the search", "",
            {"modes": probed}))
    return usable, findings


def shared_compiles(space: dict, modes: list[str]) -> list[Finding]:
    """A note when a continuous ``dropout`` is searched beside compiled modes: dropout is a
    constant of the compiled graph, so each new value is a new graph and a cold compile;
    only trials that repeat a graph (confirmation seeds, the LR probe, equal dropout) load
    theirs from the shared cache."""
    from sweeps.spec.space import LogUniform, Uniform

    compiled = [m for m in modes if m != "none"]
    if not compiled or not isinstance(space.get("dropout"), (Uniform, LogUniform)):
        return []
    return [Finding(
        "compile", "info", f"dropout is searched over a continuous range beside {compiled}: "
        "it is a constant of the compiled graph, so every compiled trial with a new dropout "
        "compiles its graph anew; the shared cache serves trials that repeat a graph "
        "(confirmation seeds, the LR probe)",
        "to let compiled trials share their graphs, search dropout as a categorical "
        "(e.g. choices [0.0, 0.1, 0.2]) or fix it", {"modes": compiled})]
