"""What the user wrote: the sweep file, its search space and write-back paths, checked."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "Sweep": "sweeps.spec.loader",
    "load_sweep": "sweeps.spec.loader",
    "load_sweep_dict": "sweeps.spec.loader",
    "read_yaml": "sweeps.spec.loader",
    "load_trainer": "sweeps.spec.trainer_loader",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
