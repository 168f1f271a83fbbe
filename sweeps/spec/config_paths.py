"""Dotted key paths into nested config mappings (``training.lr``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from sweeps.errors import a_type

_MISSING = object()


def split_path(path: str) -> list[str]:
    """Split ``a.b.c`` into its keys; empty parts are an error."""
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ValueError(f"{path!r} is not a dotted key path like 'training.lr'")
    return parts


def get_path(config: Mapping[str, Any], path: str, default: Any = _MISSING) -> Any:
    """Value at ``path``; ``default`` (or KeyError) where it is absent."""
    node: Any = config
    for key in split_path(path):
        if not isinstance(node, Mapping) or key not in node:
            if default is _MISSING:
                raise KeyError(path)
            return default
        node = node[key]
    return node


def collision(config: Mapping[str, Any], path: str) -> str | None:
    """The prefix of ``path`` that holds a non-mapping value in ``config``, if any.

    Setting ``training.lr`` in ``{"training": 0.1}`` would have to replace the
    scalar ``training``: that prefix is returned so the caller can refuse.
    """
    node: Any = config
    keys = split_path(path)
    for i, key in enumerate(keys[:-1]):
        if key not in node:
            return None
        node = node[key]
        if not isinstance(node, Mapping):
            return ".".join(keys[: i + 1])
    return None


def with_values(config: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with each ``path: value`` in ``values`` set.

    Missing intermediate mappings are created; unrelated keys and their order
    are kept.

    Example:
        >>> with_values({"training": {"lr": 0.1, "epochs": 3}}, {"training.lr": 0.01})
        {'training': {'lr': 0.01, 'epochs': 3}}
    """
    out = copy.deepcopy(dict(config))
    for path, value in values.items():
        keys = split_path(path)
        node = out
        for key in keys[:-1]:
            nxt = node.get(key)
            if nxt is None:
                nxt = node[key] = {}
            elif not isinstance(nxt, dict):
                raise ValueError(f"{path!r}: {key!r} holds {a_type(nxt)}, not a mapping")
            node = nxt
        node[keys[-1]] = value
    return out


def leaf_paths(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every dotted path to a value (not a section) of ``config``.

    Example:
        >>> leaf_paths({"train": {"lr": 0.1, "betas": [0.9, 0.99]}, "seed": 0})
        ['train.lr', 'train.betas', 'seed']
    """
    out = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        out += leaf_paths(value, path + ".") if isinstance(value, Mapping) else [path]
    return out
