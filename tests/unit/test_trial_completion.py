"""Who closes a trial: Ray Tune's TrialEvents callback, once; the book tells its listeners.

And the book registry: open only inside ``with books_of(sweep)``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sweeps.protocol import CRASH, FINAL_KEY, OK, STATUS_KEY
from sweeps.record.book import TrialRecord, books_of, open_book
from sweeps.spec.loader import load_sweep
from sweeps.tune.callbacks import TrialEvents


@pytest.fixture()
def sweep(linreg_dir):
    return load_sweep(linreg_dir / "linreg.yaml", workdir=linreg_dir)


def _ran(book, trial_id: str, steps: int = 3) -> SimpleNamespace:
    config = {"lr": 0.1}
    for s in range(1, steps + 1):
        book.record(trial_id, {"step": s, "loss": 1.0 / s, "config": config})
    last = {"step": steps, "loss": 1.0 / steps, "config": config, STATUS_KEY: OK, FINAL_KEY: 1}
    return SimpleNamespace(trial_id=trial_id, last_result=last, error_file=None, path=None,
                           run_metadata=SimpleNamespace(error_filename=None))


def test_the_callback_closes_a_trial_once_and_listeners_hear_it_once(sweep):
    told: list[TrialRecord] = []
    with books_of(sweep):
        book = open_book(sweep)
        book.on_finish(told.append)
        book.on_finish(told.append)  # the same listener twice is one listener
        trial = _ran(book, "t1")
        events = TrialEvents(book)
        events.on_trial_complete(0, [], trial)
        events.on_trial_complete(0, [], trial)  # a second end event changes nothing
        assert [r.trial_id for r in told] == ["t1"]
        assert told[0].finished and told[0].status == OK and told[0].last_step == 3


def test_a_worker_that_failed_closes_the_trial_as_a_crash_with_what_ray_said(sweep, tmp_path):
    error = tmp_path / "error.txt"
    error.write_text("ray.exceptions.ActorDiedError: The actor died unexpectedly "
                     "before finishing this task.\n\tpid: 4242\n\tip: 127.0.0.1\n")
    told: list[TrialRecord] = []
    with books_of(sweep):
        book = open_book(sweep)
        book.on_finish(told.append)
        trial = _ran(book, "t2")
        trial.last_result = {"step": 3, "config": {"lr": 0.1}}  # no final summary: it died
        trial.error_file = str(error)
        TrialEvents(book).on_trial_error(0, [], trial)
    assert told[0].status == CRASH and told[0].reason == "crash"
    # the details, not only the bare fact
    assert "died (pid 4242 on 127.0.0.1)" in told[0].evidence["error"]
    assert told[0].evidence["log"] == str(error)


def test_books_are_handed_out_only_inside_the_block(sweep):
    with pytest.raises(RuntimeError, match="books_of"):
        open_book(sweep)
    with books_of(sweep):
        book = open_book(sweep)
        assert open_book(sweep) is book  # one book per folder: Tune's restored state binds to it
        assert open_book(sweep, "other") is not book
        with pytest.raises(RuntimeError, match="open already"):
            with books_of(sweep):
                pass
    with pytest.raises(RuntimeError):
        open_book(sweep)
    with books_of(sweep):  # a new block reads the journal back: a fresh book, same trials
        assert open_book(sweep) is not book


def test_a_retried_trial_replaces_what_its_dead_attempt_reported_past_the_checkpoint(sweep):
    """The dead attempt reported steps 1-41 (checkpoint at 40); the retry resumes at 41 and
    reports 41 again. The history holds each step once, the retry's, live and read back
    from the journal; two reports at one step outside a retry (a trainer reporting its
    validation apart) are both kept."""
    from sweeps.record.book import TrialBook

    config = {"lr": 0.1}
    with books_of(sweep):
        book = open_book(sweep)
        for s in range(1, 42):
            book.record("t", {"step": s, "loss": 1.0 / s, "attempt": 1, "config": config})
        book.record("t", {"step": 41, "val_loss": 0.5, "config": config})  # validation apart
        book.mark_retry("t")
        for s in range(41, 45):
            book.record("t", {"step": s, "loss": 1.0 / s, "attempt": 2, "config": config})
        live = book.trials["t"].history
        assert [h["step"] for h in live] == list(range(1, 45))
        assert [h["attempt"] for h in live[39:]] == [1, 2, 2, 2, 2]
        again = TrialBook(sweep)
        again.load()
        assert again.trials["t"].history == live and again.trials["t"].retries == 1
