"""Input scale: features whose magnitude would blow up a first layer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from sweeps.preflight.findings import Finding


def feature_columns(batch: Any) -> dict[str, torch.Tensor]:
    """Name -> 1-D values, from a tensor ``[..., F]`` or a mapping of named tensors."""
    if isinstance(batch, torch.Tensor):
        batch = {"x": batch}
    if not isinstance(batch, Mapping):
        raise TypeError(f"sample_batch must return a tensor or a mapping, not "
                        f"{type(batch).__name__}")
    out: dict[str, torch.Tensor] = {}
    for name, value in batch.items():
        t = torch.as_tensor(value).detach().float()
        if t.ndim <= 1:
            out[str(name)] = t.reshape(-1)
        else:
            flat = t.reshape(-1, t.shape[-1])
            for i in range(flat.shape[1]):
                out[f"{name}[{i}]"] = flat[:, i]
    return out


def check_batch(batch: Any, limit: float) -> list[Finding]:
    """A finding per feature whose |mean| or std exceeds ``limit``, naming it."""
    findings = []
    for name, values in feature_columns(batch).items():
        finite = values[torch.isfinite(values)]
        if finite.numel() == 0:
            findings.append(Finding("inputs", "warning", f"feature {name} has no finite "
                                    "value in the sample batch", "check the data pipeline",
                                    {"feature": name}))
            continue
        mean, std = float(finite.mean()), float(finite.std()) if finite.numel() > 1 else 0.0
        peak = float(finite.abs().max())
        if abs(mean) > limit or std > limit:
            findings.append(Finding(
                "inputs", "warning", f"feature {name} has mean {mean:.4g}, std {std:.4g}, "
                f"max |x| {peak:.4g}: at this scale a first layer's activations and "
                "gradients blow up", "normalise it (subtract a mean, divide by a std from the "
                "training set) before the first layer",
                {"feature": name, "mean": mean, "std": std, "max_abs": peak, "limit": limit}))
        if finite.numel() < values.numel():
            findings.append(Finding("inputs", "warning", f"feature {name} has "
                                    f"{values.numel() - finite.numel()} non-finite values",
                                    "clean or mask them before training", {"feature": name}))
    return findings
