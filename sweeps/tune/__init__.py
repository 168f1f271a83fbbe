"""The only package that imports Ray: Ray Tune runs, the searcher, schedulers, callbacks."""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "run_search": "sweeps.tune.experiments",
    "run_configs": "sweeps.tune.experiments",
    "StabilityAwareSearch": "sweeps.tune.searcher",
    "study_storage": "sweeps.tune.searcher",
    "ray_running": "sweeps.tune.session",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
