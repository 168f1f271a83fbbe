"""Running sweeps on a standing Ray cluster: submission through the Ray Jobs API.

``sweeps.cluster.jobs.add_commands`` registers ``sweeps submit`` and ``sweeps jobs ...``;
``sweeps.cluster.auth`` finds the Ray auth token a token-protected cluster asks for.
"""
