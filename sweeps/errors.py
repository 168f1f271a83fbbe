"""Errors the user must fix before anything runs."""

from __future__ import annotations


class SpecError(Exception):
    """A problem in the user's input: names the key path and the fix.

    The CLI prints it as one message and exits with code 2, before any file
    is written or Ray is started.
    """

    exit_code = 2

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"{key}: {problem}. Fix: {fix}")


class PreflightFailed(Exception):
    """Preflight found a problem that would waste every trial; the CLI exits with 3."""

    exit_code = 3


class ProbeCrashed(Exception):
    """The trainer raised (not an instability) in the boundary probe that sets
    ``search_space.lr.high: probe``; the CLI exits with 1."""

    exit_code = 1


class ClusterNotReady(Exception):
    """A cluster did not become ready to take a job in time; the CLI exits with 1."""

    exit_code = 1


class RayNotStarted(Exception):
    """Ray did not start (or could not be reached) before anything ran; the CLI exits
    with 1."""

    exit_code = 1


def a_type(value: object) -> str:
    """``value``'s type with its article, for messages: ``an int``, ``a list``.

    Example:
        >>> a_type(3), a_type([1]), a_type(None)
        ('an int', 'a list', 'nothing (null)')
    """
    if value is None:
        return "nothing (null)"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class Terminated(SystemExit):
    """SIGTERM reached the command (``sweeps`` turns it into this exit, code 15): a trainer
    running in the command's own process (``sweeps try``) must not take it for its own
    ``sys.exit``."""
