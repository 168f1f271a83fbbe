"""Hydra config-group choices as knobs: which option of a config group a trial composes.

A knob whose ``write_back`` path names a config group of the primary config's ``defaults:``
list (``optim: {type: categorical, choices: [sgd, adamw]}`` with ``write_back: {optim:
optim}``) picks that group's option, as ``optim=adamw`` does on a Hydra command line: the
whole group changes (AdamW's ``betas`` come with it), not one string. Every combination
of the group knobs' options is composed by Hydra once, when the sweep is loaded (a
misspelt option is bad input then), and kept in the sweep (``sweep.yaml``'s
``hydra_groups``), so trials, ``sweeps resume`` and cluster workers need no Hydra. The
other knobs are written into the composed config of their trial's options; a hand-over's
override list starts with the group choices (``optim=adamw training.lr=0.003 …``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeps.errors import SpecError
from sweeps.spec.hydra_config import BadGroupYaml
from sweeps.spec.space import Categorical, Fixed

#: Most combinations of group options composed for one sweep.
MAX_COMBINATIONS = 64


def primary_groups(data: Mapping[str, Any]) -> dict[str, str | None]:
    """The config groups a primary config's ``defaults:`` list picks, with their options
    (``optional``/``override`` and a ``@package`` do not change the group's name).

    Example:
        >>> primary_groups({"defaults": [{"model": "small"}, {"optional db@x": None},
        ...                              {"override optim": "sgd"}, "_self_"]})
        {'model': 'small', 'db': None, 'optim': 'sgd'}
    """
    out: dict[str, str | None] = {}
    for entry in data.get("defaults") or []:
        if not isinstance(entry, Mapping) or len(entry) != 1:
            continue
        (key, option), = entry.items()
        name = str(key).split("@")[0].strip()
        for prefix in ("optional ", "override "):
            name = name.removeprefix(prefix).strip()
        out[name] = option if isinstance(option, str) or option is None else str(option)
    return out


def group_options(conf_dir: Path, group: str) -> list[str]:
    """The options of a config group: the YAML files in its folder."""
    folder = conf_dir / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def group_of_choices(knob: Any, groups: Mapping[str, str | None],
                     conf_dir: Path) -> str | None:
    """The config group whose options hold every choice of a categorical ``knob`` of text
    values (``[adamw, sgd]`` -> ``optim``: ``conf/optim/adamw.yaml`` …), else None."""
    values = knob.choices if isinstance(knob, Categorical) else None
    if not values or not all(isinstance(v, str) for v in values):
        return None
    return next((g for g in groups if set(values) <= set(group_options(conf_dir, g))), None)


def inner_name_notes(write_back: Mapping[str, str], knobs: Mapping[str, Any],
                     groups: Mapping[str, str | None], conf_dir: Path) -> list[str]:
    """A note per categorical knob written to a key inside a config group whose choices
    are that group's options (``optim.name: [sgd, adamw]``): it changes one string, and
    the rest of the group stays the primary config's option."""
    notes = []
    for knob, path in write_back.items():
        group, _, inner = path.partition(".")
        entry = knobs.get(knob)
        if not inner or group not in groups or not isinstance(entry, Categorical):
            continue
        options = set(group_options(conf_dir, group))
        if len(entry.choices) > 1 and {str(c) for c in entry.choices} <= options:
            notes.append(f"write_back.{knob}: '{path}' is a key inside the config group "
                         f"'{group}', so a trial changes that string and keeps the rest of "
                         f"{group}={groups[group]}; to switch the whole group write the knob "
                         f"to '{group}' (write_back: {{{knob}: {group}}})")
    return notes


def group_knobs(write_back: Mapping[str, str], knobs: Mapping[str, Any],
                groups: Mapping[str, str | None],
                conf_dir: Path | None = None) -> dict[str, str]:
    """``knob -> group`` for the knobs written to a config group's name; a knob there
    whose values are not options (a number range) is a SpecError naming it."""
    out = {}
    for knob, path in write_back.items():
        if path not in groups or knob not in knobs:
            continue
        entry = knobs[knob]
        values = entry.choices if isinstance(entry, Categorical) else \
            [entry.value] if isinstance(entry, Fixed) else None
        if values is None or not all(isinstance(v, str) for v in values):
            options = group_options(conf_dir, path) if conf_dir is not None else []
            shown = ", ".join(options or [groups[path] or "option_a", "option_b"])
            raise SpecError(f"search_space.{knob}", f"write_back writes it to '{path}', a "
                            "Hydra config group, whose values are the group's options",
                            f"write e.g. {knob}: {{type: categorical, choices: [{shown}]}}")
        out[knob] = path
    return out


def variant_key(choices: Mapping[str, Any]) -> str:
    """The key of one combination of group options: its override list, by group.

    Example:
        >>> variant_key({"optim": "adamw", "model": "wide"})
        'model=wide optim=adamw'
    """
    return " ".join(f"{group}={choices[group]}" for group in sorted(choices))


@dataclass(frozen=True)
class GroupKnobs:
    """The group knobs of a sweep and the config Hydra composed for each combination."""

    knobs: dict[str, str]  # knob -> config group
    defaults: dict[str, str | None]  # config group -> the primary config's option
    configs: dict[str, dict[str, Any]]  # variant_key -> composed config

    def choices(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``group -> option`` of a trial (a knob it lacks keeps the primary's option)."""
        return {group: values.get(knob, self.defaults.get(group))
                for knob, group in self.knobs.items()}

    def config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The composed config of the trial's options."""
        key = variant_key(self.choices(values))
        if key not in self.configs:
            raise SpecError(", ".join(f"search_space.{k}" for k in self.knobs),
                            f"{key} is not among the options the sweep composed "
                            f"({'; '.join(self.configs)})", "give one of the listed options")
        return self.configs[key]

    def overrides(self, values: Mapping[str, Any]) -> list[str]:
        """The group choices as Hydra overrides (``optim=adamw``)."""
        return [f"{group}={option}" for group, option in self.choices(values).items()]

    def mapped(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> GroupKnobs:
        """The same knobs with ``change`` applied to every composed config."""
        return GroupKnobs(dict(self.knobs), dict(self.defaults),
                          {k: change(v) for k, v in self.configs.items()})

    def to_data(self) -> dict[str, Any]:
        """As kept in ``sweep.yaml`` (``hydra_groups``)."""
        return {"knobs": dict(self.knobs), "defaults": dict(self.defaults),
                "configs": dict(self.configs)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> GroupKnobs:
        """Read back :meth:`to_data`; a SpecError naming ``hydra_groups`` if damaged."""
        try:
            knobs, defaults, configs = (dict(data[k]) for k in ("knobs", "defaults", "configs"))
        except (KeyError, TypeError, ValueError):
            raise SpecError("hydra_groups", "is not what sweeps wrote (knobs, defaults, "
                            "configs)", "leave the hydra_groups sweeps keeps in a results "
                            "folder's sweep.yaml as written") from None
        return cls(knobs, defaults, configs)


def compose_variants(path: Path, knobs: Mapping[str, str], space: Mapping[str, Any],
                     defaults: Mapping[str, str | None],
                     compose: Callable[[Path, list[str]], dict[str, Any]]) -> GroupKnobs:
    """Compose every combination of the group knobs' options (at most
    :data:`MAX_COMBINATIONS`); an option Hydra cannot compose is a SpecError naming its
    knob."""
    options = {}
    for knob in knobs:
        entry = space[knob]
        options[knob] = list(entry.choices) if isinstance(entry, Categorical) else [entry.value]
    count = math.prod(len(values) for values in options.values())
    if count > MAX_COMBINATIONS:
        raise SpecError(f"search_space.{next(iter(knobs))}", f"the group knobs make {count} "
                        f"combinations of config-group options, more than {MAX_COMBINATIONS}",
                        "search fewer groups or options at once")
    configs = {}
    names = list(knobs)
    for combo in itertools.product(*(options[k] for k in names)):
        choices = {knobs[k]: option for k, option in zip(names, combo, strict=True)}
        try:
            configs[variant_key(choices)] = compose(path, [f"{g}={o}" for g, o in choices.items()])
        except SpecError as exc:  # named by the first knob off the primary's option
            changed = [k for k, option in zip(names, combo, strict=True)
                       if option != defaults.get(knobs[k])]
            knob = (changed or names)[0]
            raise SpecError(f"search_space.{knob}.choices",
                            f"{variant_key(choices)}: {exc.problem}",
                            exc.fix if isinstance(exc, BadGroupYaml) else
                            "list options that exist in the config group's folder") from None
    return GroupKnobs(dict(knobs), {g: defaults.get(g) for g in knobs.values()}, configs)
