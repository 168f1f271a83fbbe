"""The argparse parser a flag-driven script's trainer module holds (docs/trainers.md, *A
script driven by command-line flags*): how it spells each option, and whether it takes the
values a knob can hand over."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from sweeps.errors import SpecError
from sweeps.spec.space import Categorical, Fixed, IntRange, LogUniform, Uniform, _Knob


def parser_of(fn: Callable[..., Any]) -> argparse.ArgumentParser | None:
    """The first ``argparse.ArgumentParser`` among the globals of ``fn``'s module
    (``from train import parser`` in the trainer of docs/trainers.md), else None."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    for value in vars(module).values() if module is not None else []:
        if isinstance(value, argparse.ArgumentParser):
            return value
    return None


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each ``dest`` of the parser's options and its action."""
    return {a.dest: a for a in parser._actions if a.option_strings}


def option_strings(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The option string of each ``dest``, the long one when there is one: ``batch_size`` ->
    ``--batch-size``, as the script spells it."""
    return {dest: next((o for o in a.option_strings if o.startswith("--")),
                       a.option_strings[0])
            for dest, a in _options(parser).items()}


def flag_text(value: Any) -> str:
    """A value as ``sweeps best --flags`` writes it after ``=``."""
    return repr(value) if isinstance(value, float) else str(value)


def _values(knob: _Knob) -> list[Any]:
    """Values a knob can hand over, enough to show what kind they are."""
    if isinstance(knob, Categorical):
        return list(knob.choices)
    if isinstance(knob, Fixed):
        return [knob.value]
    if isinstance(knob, IntRange):
        return [knob.low, knob.high]
    if isinstance(knob, (Uniform, LogUniform)):
        return [float(knob.low), float(knob.high), (knob.low + knob.high) / 2]
    return []


def refused(action: argparse.Action, value: Any) -> str | None:
    """Why the option would refuse ``--option=value`` (as argparse converts and checks a
    value given on the command line), else None. An option that takes no value
    (``store_true``) is left alone: docs/trainers.md says how a bool is passed."""
    if action.nargs == 0 or value is None or isinstance(value, bool):
        return None
    text = flag_text(value)
    convert = action.type if callable(action.type) else None
    try:
        parsed = convert(text) if convert is not None else text
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        kind = getattr(convert, "__name__", repr(convert))
        return f"{text!r} is not {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    choices = action.choices
    if choices is not None and parsed not in choices:
        shown = ", ".join(repr(c) for c in choices)
        return f"{text!r} is not one of its choices ({shown})"
    return None


def check_values(parser: argparse.ArgumentParser, space: dict[str, _Knob],
                 write_back: dict[str, str]) -> None:
    """A SpecError for the first knob written back to an option of the script's parser that
    the option would refuse on its own command line: the trial gets it by ``setattr``, past
    argparse's ``choices`` and ``type`` (``AdamW`` where the parser takes ``adamw`` runs the
    script's fallback, and ``sweeps best --flags`` hands over a flag the script rejects)."""
    options = _options(parser)
    for name, knob in space.items():
        path = write_back.get(name)
        if path is None or path not in options:
            continue
        action = options[path]
        for value in _values(knob):
            why = refused(action, value)
            if why is None:
                continue
            flag = option_strings(parser)[path]
            if action.choices is not None:
                fix = ("use the parser's own spelling in the knob's choices: "
                       + ", ".join(repr(c) for c in action.choices))
            elif isinstance(knob, (Uniform, LogUniform)):
                fix = f"make the knob '{name}' of type: int, or {flag} take a float"
            else:
                fix = f"give the knob values {flag} takes"
            key = f"search_space.{name}" + (".choices" if isinstance(knob, Categorical) else "")
            raise SpecError(key, f"the script's parser refuses {flag}={flag_text(value)}: "
                            f"{why}", fix)
