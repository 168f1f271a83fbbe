"""Credentials never written or printed: in any text sweeps keeps or shows, a URL's
password (``scheme://user:password@host`` becomes ``scheme://user:***@host``), a user
part with no password (commonly a token: ``scheme://***@host``) and the values of
query parameters whose names look secret (``?token=***``) are masked."""

from __future__ import annotations

import re

#: What stands for a hidden credential.
MASK = "***"

#: ``scheme://userinfo@`` in a URL: the authority runs up to ``/``, ``?``, ``#`` or a
#: space, and its userinfo ends at the authority's LAST ``@`` (as urllib and requests
#: split it), so a password may hold ``@``.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s]*)@")

#: ``?name=value`` (or after ``&``, ``;``, ``#``); the value ends at the next separator
#: or space; quotes and punctuation just before those are left out of it (a shell-quoted
#: URL, a URL at the end of a sentence).
_PARAM = re.compile(r"(?P<head>[?&;#](?P<name>[\w.\-]+)=)"
                    r"(?P<value>[^&;#\s]*?)(?=['\")\]},.:]*(?:[&;#\s]|$))")

#: Words of a parameter name that make its value a secret (``access_token``,
#: ``X-Amz-Signature``, ``apiKey``, ``client_secret``, ``pwd`` ...).
_SECRET_WORDS = frozenset({"token", "password", "passwd", "pwd", "pass", "secret", "key",
                           "apikey", "sig", "signature", "auth", "authorization",
                           "credential", "credentials", "jwt"})
_SECRET_ENDINGS = ("token", "secret", "password", "key")


def secret_name(name: str) -> bool:
    """Whether a query parameter named ``name`` carries a secret (case-insensitive).

    Example:
        >>> [secret_name(n) for n in ("token", "Access_Token", "apiKey", "sig", "run_id")]
        [True, True, True, True, False]
    """
    words = re.split(r"[\W_]+", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).lower())
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def _userinfo(match: re.Match[str]) -> str:
    user, colon, password = match["userinfo"].partition(":")
    if colon:
        shown = f"{user}:{MASK}" if password else match["userinfo"]
    else:
        shown = MASK if user else ""
    return f"{match['head']}{shown}@"


def _param(match: re.Match[str]) -> str:
    if match["value"] and secret_name(match["name"]):
        return f"{match['head']}{MASK}"
    return match[0]


def hide_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: the password (all of the
    userinfo after its first ``:``, up to the authority's last ``@``), a user part with
    no password, and the values of query parameters named like secrets. The rest of the
    text is kept as it is; masking twice changes nothing more.

    Example:
        >>> hide_credentials("sweeps run s.yaml --tracking-uri http://alice:S3cret@host/")
        'sweeps run s.yaml --tracking-uri http://alice:***@host/'
        >>> hide_credentials("http://alice:p@ss@127.0.0.1:9/")
        'http://alice:***@127.0.0.1:9/'
        >>> hide_credentials("https://ghp_T0KEN@host/x")
        'https://***@host/x'
        >>> hide_credentials("https://host/?experiment=a&access_token=QS3cret#top")
        'https://host/?experiment=a&access_token=***#top'
        >>> hide_credentials("https://host:5000/path sqlite:////data/a@b/mlflow.db")
        'https://host:5000/path sqlite:////data/a@b/mlflow.db'
    """
    return _PARAM.sub(_param, _USERINFO.sub(_userinfo, text))


def credentials_in(uri: str) -> list[str]:
    """The secrets :func:`hide_credentials` masks in ``uri``, longest first (to mask them
    in text that holds them apart from the URI, such as an error message).

    Example:
        >>> credentials_in("http://alice:p@ss@host/?token=QS3cret&page=2")
        ['QS3cret', 'p@ss']
    """
    found = [m["userinfo"].partition(":")[2] if ":" in m["userinfo"] else m["userinfo"]
             for m in _USERINFO.finditer(uri)]
    found += [m["value"] for m in _PARAM.finditer(uri) if secret_name(m["name"])]
    return sorted({v for v in found if v and v != MASK}, key=len, reverse=True)
