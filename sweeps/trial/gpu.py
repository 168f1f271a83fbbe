"""The GPU a trial runs on: the device handed to the trainer and its peak memory.

Every CUDA call is guarded by ``torch.cuda.is_available()``: on a machine without CUDA
a trial runs on ``cpu`` and reports no GPU memory.
"""

from __future__ import annotations

from typing import Any


def cuda_available() -> bool:
    """Whether this process can use CUDA."""
    import torch

    return bool(torch.cuda.is_available())


def trial_device(gpu_ids: list[Any], gpu_requested: bool) -> str:
    """``cuda:0`` when the trial has a GPU (Ray assigned one, or ``resources.gpu`` > 0
    outside Ray) and CUDA is available, else ``cpu``.

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the assigned GPU, so inside the trial that GPU is
    device 0 whatever its id on the machine.

    Example:
        >>> trial_device([], gpu_requested=False)
        'cpu'
    """
    if (gpu_ids or gpu_requested) and cuda_available():
        return "cuda:0"
    return "cpu"


def reset_peak() -> None:
    """Start counting the trial's peak GPU memory from now (nothing without CUDA)."""
    if cuda_available():
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_mb() -> float | None:
    """Peak GPU memory allocated since :func:`reset_peak`, in MiB; None without CUDA."""
    if not cuda_available():
        return None
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


def with_peak(message: str) -> str:
    """``message`` with the trial's peak GPU memory appended when CUDA is present
    (``... (peak GPU memory 7811 MiB of 8192 MiB)``), else unchanged."""
    peak = peak_mb()
    if peak is None:
        return message
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return f"{message} (peak GPU memory {peak:.0f} MiB of {total / 2**20:.0f} MiB)"
