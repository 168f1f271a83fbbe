"""Credentials never written or printed: ``scheme://user:password@host`` becomes
``scheme://user:***@host`` in any text sweeps keeps or shows."""

from __future__ import annotations

import re

#: ``//user:password@`` inside a URL (the password: anything up to the ``@``).
_USERINFO = re.compile(r"(?P<head>//[^/@\s:]*:)(?P<password>[^@/\s]+)(?P<at>@)")


def hide_credentials(text: str) -> str:
    """``text`` with the password of every URL in it masked.

    Example:
        >>> hide_credentials("sweeps run s.yaml --tracking-uri http://alice:S3cret@host/")
        'sweeps run s.yaml --tracking-uri http://alice:***@host/'
        >>> hide_credentials("https://host:5000/path")
        'https://host:5000/path'
    """
    return _USERINFO.sub(lambda m: f"{m['head']}***{m['at']}", text)
