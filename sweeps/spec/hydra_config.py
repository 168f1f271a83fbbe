"""Hydra users: a base config composed by Hydra, and overrides for the configs handed over.

A base config file with a top-level ``defaults:`` list is a Hydra primary config. It is
composed with Hydra's own compose API (``initialize_config_dir`` + ``compose``) from the
folder it lies in, so config groups, ``_self_`` and package directives mean what they
mean to Hydra; the composed config is what the trials get and what ``sweep.yaml`` keeps
(``sweeps resume`` does not need Hydra). Interpolations (``${training.lr}``) are kept as
they are, so a knob written at ``training.lr`` reaches every place that refers to it once
the trainer resolves the config (``OmegaConf.create(config)``).

Each config handed over is also written as the override list a Hydra user passes on the
command line (``stable/rank-01-<trial>.overrides``): ``python train.py $(cat …)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sweeps.errors import SpecError
from sweeps.spec.config_paths import get_path

#: A string Hydra's override grammar reads back as the same string when left unquoted.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./\-]*")
_NOT_PLAIN = {"true", "false", "null", "nan", "inf", "none"}


def is_hydra(data: Any) -> bool:
    """Whether a base config's YAML is a Hydra primary config (a ``defaults:`` list)."""
    return isinstance(data, Mapping) and isinstance(data.get("defaults"), list)


class BadGroupYaml(SpecError):
    """A config file Hydra read while composing is not valid YAML: its own fix stands."""


def compose(path: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The config Hydra composes from the primary config at ``path`` with ``overrides``
    (``optim=adamw``; interpolations kept); a SpecError naming ``base_config`` when Hydra
    is missing or refuses it."""
    try:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
        from omegaconf import OmegaConf
    except ImportError:
        raise SpecError("base_config", f"{path} is a Hydra config (it has a `defaults:` "
                        "list) and Hydra is not installed",
                        "pip install 'sweeps[hydra]' (hydra-core), or give a plain YAML "
                        "config") from None
    if GlobalHydra.instance().is_initialized():  # e.g. a caller inside a Hydra app
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(path.parent.resolve()), version_base=None,
                                   job_name="sweeps"):
            cfg = hydra_compose(config_name=path.stem, overrides=list(overrides))
    except yaml.MarkedYAMLError as exc:  # a config file of the group Hydra read
        mark = exc.problem_mark
        where = f"{mark.name}, line {mark.line + 1}" if mark is not None else str(path)
        raise BadGroupYaml("base_config", f"Hydra could not read {where}: {exc.problem}",
                           "fix the YAML of that file (a key given twice: keep one)") from None
    except Exception as exc:  # Hydra's MissingConfigException, ConfigCompositionException…
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        options = available_options(str(exc))
        raise SpecError("base_config", f"Hydra could not compose {path}: {first[:300]}"
                        + (f" ({options})" if options else ""),
                        "fix the defaults list or the config group it names (`python "
                        "train.py --cfg job` shows what Hydra composes)") from None
    data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict)
    return data


def available_options(message: str) -> str:
    """Hydra's list of a config group's options in an error message, on one line.

    Example:
        >>> available_options("Could not find 'model/tiny'\\n\\nAvailable options in "
        ...                   "'model':\\n\\tsmall\\n\\twide\\nConfig search path:")
        "available options in 'model': small, wide"
    """
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Available options in"):
            names = []
            for option in lines[i + 1:]:
                if not option.startswith(("\t", " ")) or not option.strip():
                    break
                names.append(option.strip())
            return f"{line.rstrip(':')[0].lower()}{line.rstrip(':')[1:]}: {', '.join(names)}"
    return ""


def override_value(value: Any) -> str:
    """``value`` in Hydra's override grammar.

    Example:
        >>> [override_value(v) for v in (0.003, 1e-05, 4, True, None, "adamw", "1e-3")]
        ['0.003', '1e-05', '4', 'true', 'null', 'adamw', "'1e-3'"]
        >>> print(override_value("a\\\\b"), override_value("it's"), override_value("x\\\\"))
        'a\\b' 'it\\'s' 'x\\\\'
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _NOT_PLAIN:
        return text
    # inside quotes Hydra reads a backslash as itself, except in a run of them before a
    # quote (or the closing one), where two stand for one
    doubled = re.sub(r"\\+(?='|$)", lambda m: m.group(0) * 2, text)
    return "'" + doubled.replace("'", "\\'") + "'"


def overrides(base_config: Mapping[str, Any], by_path: Mapping[str, Any]) -> list[str]:
    """The override list setting each dotted path to its value: ``key=value``, or
    ``+key=value`` for a path the base config does not have (``new_keys``)."""
    missing = object()
    out = []
    for path, value in by_path.items():
        add = "+" if get_path(base_config, path, missing) is missing else ""
        out.append(f"{add}{path}={override_value(value)}")
    return out
