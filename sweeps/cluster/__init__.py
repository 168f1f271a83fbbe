"""Running sweeps on a standing Ray cluster: submission through the Ray Jobs API.

``sweeps.cluster.jobs.add_commands`` registers ``sweeps submit`` and ``sweeps jobs ...``;
``sweeps.cluster.auth`` finds the Ray auth token a token-protected cluster asks for.
"""

from __future__ import annotations

from sweeps._lazy import exports

#: Public name -> the module that defines it (loaded on first use).
_LAZY = {
    "connect": "sweeps.cluster.jobs",
    "find_token": "sweeps.cluster.auth",
    "token_may_go_to": "sweeps.cluster.auth",
}
__all__, __getattr__, __dir__ = exports(__name__, _LAZY, globals())
