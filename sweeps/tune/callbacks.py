"""Ray Tune's hooks into the trial book: the stopper that runs the rules on the driver,
and the callbacks that record retries and dead workers and keep a dead worker's output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.tune import Callback, Stopper

from sweeps.record.book import TrialBook
from sweeps.record.worker_logs import keep_worker_output, worker_log_path, worker_pid
from sweeps.state import folder_watch
from sweeps.tune import session as ray_session


class RuleStopper(Stopper):
    """Ray Tune stopper running the same rules on the driver as in the trial."""

    def __init__(self, book: TrialBook) -> None:
        self.book = book

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        rec = self.book.record(trial_id, result)
        # a trial the journal shows finished is being re-run after a driver restart: stop it
        return rec.failed or rec.finished

    def stop_all(self) -> bool:
        return False


class TrialEvents(Callback):
    """Ray Tune callback, the one owner of a trial's end: closes it in the book (which
    tells the searcher, see :meth:`TrialBook.on_finish`), with what Ray said when its
    worker failed; counts the retries of trials whose worker died.

    A callback, not the searcher: confirmation and stability runs have no searcher, and
    a callback sees every end (complete, error, a pending trial removed)."""

    def __init__(self, book: TrialBook) -> None:
        self.book = book

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.book.mark_retry(trial.trial_id)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.book.finish(trial.trial_id, _result(trial), error=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        local, name = trial.error_file, trial.run_metadata.error_filename
        try:  # Ray writes it here first and copies it into the results folder later
            text = Path(local).read_text(errors="replace") if local else ""
        except OSError:
            text = ""
        kept = str(Path(trial.path, name)) if trial.path and name else local
        self.book.worker_failed(trial.trial_id, text, kept)
        self.book.finish(trial.trial_id, _result(trial), error=True)


def _result(trial: Any) -> dict[str, Any]:
    """The trial's last result, with its config even when it never reported (a re-run's
    role and seed are in the config)."""
    return {"config": getattr(trial, "config", None) or {}, **(trial.last_result or {})}


class WorkerLogs(Callback):
    """Ray Tune callback: when a trial fails in Ray (its worker died; a trainer's own exception
    is caught in the trial), keep its worker's output in ``trials/<id>.worker.log``."""

    def __init__(self, book: Any) -> None:
        self.book = book  # a TrialBook: pickled by reference, so resume finds the folder

    @property
    def folder(self) -> Path:
        return self.book.sweep.output_dir / self.book.folder

    def _keep(self, trial: Any, attempt: str) -> None:
        session = ray_session.current()
        pid = worker_pid(trial)
        if session is None or session.logs is None or pid is None:
            return
        keep_worker_output(session.logs, pid, worker_log_path(self.folder, trial.trial_id),
                           attempt)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._keep(trial, "attempt failed, the trial is retried")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._keep(trial, "the trial failed")


class WatchFolder(Callback):
    """Stops the run at the first step after its results folder was deleted or moved
    (:class:`sweeps.state.folder_watch.FolderGone`, out of ``tuner.fit``). It keeps no
    state of its own, so one restored with Ray Tune's experiment (a resume, maybe from a
    moved folder) watches the folder the command runs in
    (:func:`sweeps.state.folder_watch.watching`)."""

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        folder_watch.check_current()
