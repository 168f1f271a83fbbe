"""`sweeps submit` right after `ray start --head`: the Jobs API answers before its agent.

The "no agent yet" answer is a race on a real head that no test can cause on demand, so
a client stand-in injects it; everything else is the real code path.
"""

from __future__ import annotations

import pytest

from sweeps.cluster.jobs import NO_AGENT, submit_when_ready
from sweeps.errors import ClusterNotReady


class _Head:
    def __init__(self, busy: int, message: str = NO_AGENT) -> None:
        self.busy, self.message, self.calls = busy, message, 0

    def submit_job(self, **kwargs):
        self.calls += 1
        if self.calls <= self.busy:
            raise RuntimeError(f"Request failed with status code 500: {self.message}.")
        return "raysubmit_1"

    def get_address(self) -> str:
        return "http://127.0.0.1:8265"


def test_waits_with_backoff_until_the_agent_is_up():
    slept: list[float] = []
    head = _Head(busy=3)
    assert submit_when_ready(head, {}, sleep=slept.append) == "raysubmit_1"
    assert head.calls == 4 and slept == [1.0, 2.0, 4.0]


def test_gives_up_with_one_clear_error():
    slept: list[float] = []
    with pytest.raises(ClusterNotReady, match="still has no job agent after 15 s"):
        submit_when_ready(_Head(busy=100), {}, wait=10, sleep=slept.append)
    assert sum(slept) == 15


def test_other_errors_are_not_retried():
    with pytest.raises(RuntimeError, match="something else"):
        submit_when_ready(_Head(busy=1, message="something else"), {}, sleep=lambda s: None)
