"""Ray token authentication, as a client of a standing cluster sees it.

Ray (2.60 here) protects a cluster with a shared token when it runs with
``RAY_AUTH_MODE=token``. ``ray start --head`` turns that on by itself when a token already
exists on the machine (``~/.ray/auth_token``, which any embedded ``ray.init()`` creates),
and ``ray.init()`` on a new local cluster always does. Every HTTP request to the dashboard
and Jobs API then needs ``Authorization: Bearer <token>``, and every driver the token on
its gRPC calls.

Ray's own clients send the token only when *their* process runs with ``RAY_AUTH_MODE=token``
(or connects with ``address="auto"`` to a cluster it found on this machine); a plain
``JobSubmissionClient`` or ``ray.init(address=...)`` gets 401 / "InvalidAuthToken". Here the
token is looked up where Ray looks (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``,
``~/.ray/auth_token``): ``sweeps.cluster.jobs`` sends it only when the cluster asks for it,
and only over https or to this machine (:func:`token_may_go_to`) unless the user passes
``--allow-insecure-token``; :func:`enable_for_driver` lets a driver's
``ray.init(address=...)`` send it.

Whoever holds the token can run any code on the cluster as the user who started it: it
must not cross a network in clear text.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from sweeps.tune.compat import cluster_needs_token, reload_ray_config

MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"


def default_token_path() -> Path:
    """Where ``ray get-auth-token --generate`` and ``ray.init()`` keep the token."""
    return Path.home() / ".ray" / "auth_token"


def find_token() -> tuple[str, str] | None:
    """``(token, where it came from)`` in Ray's order of precedence, or None."""
    token = os.environ.get(TOKEN_VAR, "").strip()
    if token:
        return token, f"${TOKEN_VAR}"
    path_text = os.environ.get(TOKEN_PATH_VAR, "").strip()
    path = Path(path_text).expanduser() if path_text else default_token_path()
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return (token, str(path)) if token else None


def enable_for_driver(address: str | None) -> bool:
    """Let ``ray.init(address=...)`` send the token to a token-protected cluster.

    Sets ``RAY_AUTH_MODE=token`` for this process when a cluster address is given, the
    mode is not set, a token exists, and the cluster does not take a client without one
    (asked first: :func:`sweeps.tune.compat.cluster_needs_token`). A driver in token mode
    on a cluster without token authentication connects, but the cluster cannot call it
    back: every trial's actor is cancelled before it starts. Returns whether it did. Ray
    Client addresses (``ray://``) are left alone.
    """
    if not address or "://" in address or os.environ.get(MODE_VAR) or find_token() is None:
        return False
    if cluster_needs_token(address) is False:
        return False
    os.environ[MODE_VAR] = "token"
    reload_ray_config()
    return True


def token_may_go_to(url: str) -> bool:
    """Whether the token may be sent to ``url`` unasked: over https, or over http to a
    host every address of which is a loopback address of this machine (127.0.0.0/8, ::1,
    ``localhost`` where it resolves there: an SSH tunnel's end). Anything else is plain
    text on a network.

    Example:
        >>> token_may_go_to("http://127.0.0.1:8265"), token_may_go_to("https://head:8265")
        (True, True)
        >>> token_may_go_to("http://head:8265"), token_may_go_to("http://10.0.0.5:8265")
        (False, False)
    """
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return False
    return all(_is_loopback(address) for address in _addresses(host) or ["0.0.0.0"])


def _addresses(host: str) -> list[str]:
    """Every address ``host`` resolves to here (a name is decided by where it points, not
    by how it is spelt: ``evil.localhost`` may point anywhere), none when it does not."""
    try:
        return [str(info[4][0]) for info in socket.getaddrinfo(host, None)]
    except (OSError, UnicodeError):
        return []


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


@contextmanager
def ray_token_off() -> Iterator[None]:
    """Ray's own clients add the token to every request when ``RAY_AUTH_MODE=token`` is
    set; within this block they do not (for a client to a URL the token must not go to)."""
    before = os.environ.get(MODE_VAR)
    if not before or before.lower() != "token":
        yield
        return
    os.environ[MODE_VAR] = "disabled"
    reload_ray_config()
    try:
        yield
    finally:
        os.environ[MODE_VAR] = before
        reload_ray_config()
