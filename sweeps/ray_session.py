"""Starting and stopping Ray for a sweep."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: Environment every sweep driver sets before Ray Tune starts.
TUNE_ENV = {
    # Ray Tune's default CSV/JSON/TensorBoard loggers cost seconds per trial;
    # sweeps keeps its own per-trial history (trials/<id>.csv) instead.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # val_loss is reported only every few steps; results without it are normal.
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
    "TUNE_MAX_PENDING_TRIALS_PG": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    # Ctrl-C (or SLURM's time-limit signal) ends the sweep with KeyboardInterrupt rather
    # than letting Tune return a partial search that would then be selected and exported;
    # `sweeps resume` continues it
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
    # save the experiment state at least every 2 s (Ray's default is 10 s or more), so a
    # driver killed mid-sweep re-runs as little as possible on `sweeps resume`
    "TUNE_GLOBAL_CHECKPOINT_S": "2",
}


def quiet_logs() -> None:
    """Silence the warnings Ray Tune and MLflow print about things sweeps does on purpose."""
    import logging

    # Tune's result analysis looks for the logger files sweeps turned off.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    logging.getLogger("ray.tune.tune").setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


@contextmanager
def ray_running(address: str | None = None, num_cpus: int | None = None,
                num_gpus: int | None = None) -> Iterator[None]:
    """Connect to ``address``, or start an embedded Ray bound to 127.0.0.1; stop what we started."""
    import ray

    for key, value in TUNE_ENV.items():
        os.environ.setdefault(key, value)  # a value the user exported wins
    quiet_logs()
    started = False
    if not ray.is_initialized():
        kwargs: dict = {"log_to_driver": False, "configure_logging": True,
                        "logging_level": "ERROR"}
        if address:
            from sweeps.cluster.auth import enable_for_driver

            enable_for_driver(address)  # send the cluster's token if it uses token auth
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                     dashboard_host="127.0.0.1", **kwargs)
        started = True
    try:
        yield
    finally:
        if started:
            ray.shutdown()
