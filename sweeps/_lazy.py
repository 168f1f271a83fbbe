"""Public names of a package loaded on first use (PEP 562), so importing a package costs
nothing until a name is asked for: ``import sweeps.results`` does not pull in pandas."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def exports(package: str, names: dict[str, str], namespace: dict[str, Any]
            ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``: each of ``names``
    (name -> the module defining it) is imported on first use and cached in
    ``namespace``."""

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(names[name]), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *names})

    return sorted(names), getattr_, dir_
