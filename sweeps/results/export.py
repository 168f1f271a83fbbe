"""Write-back: the chosen knob values merged into the user's own base config.

A YAML hand-over carries its provenance header as comments; JSON has none, so a JSON
hand-over (``rank-01-<trial>.json``, the base config's own format) is the config alone
and its header is the text file beside it (``rank-01-<trial>.header``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from sweeps.protocol import BASE_NOT_COMPARED, WORSE_THAN_BASE
from sweeps.spec.argparse_options import flag_text
from sweeps.spec.config_paths import with_values
from sweeps.spec.hydra_config import overrides
from sweeps.spec.loader import Sweep, unmapped_step_count
from sweeps.state.atomic import write_text
from sweeps.terminal import clean


def config_for(sweep: Sweep, values: dict[str, Any]) -> dict[str, Any]:
    """The base config with ``values`` set at their write-back paths (no ``sweep`` key)."""
    return with_values(sweep.base_for(values), sweep.values_by_path(values))


def _fmt(value: Any) -> str:
    """A value as the header's comment shows it: on one line, without control characters
    (a newline in a text knob's value would end the comment)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return " ".join(clean(value).split("\n")).replace("\t", " ")


#: Text PyYAML writes bare that YAML 1.2 readers (OmegaConf, Hydra) take as a number.
_NUMBER_LIKE = re.compile(r"[-+]?(?:\d[\d_]*)?\.?\d*[eE][-+]?\d+")


class _TextKeepingDumper(yaml.SafeDumper):
    """``SafeDumper`` that quotes text a YAML 1.2 reader would take as a number: PyYAML
    (YAML 1.1) writes ``"1e-3"`` bare, and Hydra read it back as the float 0.001."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if _NUMBER_LIKE.fullmatch(text):
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="'")
    return dumper.represent_str(text)


_TextKeepingDumper.add_representer(str, _text)


def render(sweep: Sweep, values: dict[str, Any], provenance: dict[str, Any]) -> str:
    """YAML text: a provenance header in comments (:func:`header`), then the merged config."""
    body = yaml.dump(config_for(sweep, values), Dumper=_TextKeepingDumper, sort_keys=False,
                     default_flow_style=False, allow_unicode=True)
    return header(sweep, provenance) + body


def render_json(sweep: Sweep, values: dict[str, Any]) -> str:
    """The merged config as JSON text, keys in the base config's order."""
    return json.dumps(config_for(sweep, values), indent=2, ensure_ascii=False) + "\n"


def header(sweep: Sweep, provenance: dict[str, Any]) -> str:
    """The provenance header: comment lines, each ending in a newline."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"# Written by sweeps {stamp} for sweep '{sweep.name}'"
             + (f" ({sweep.source})" if sweep.source else "")]
    for key, value in provenance.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
        lines.append(f"# {key}: {_fmt(value)}")
    steps = sweep.spec.budget.max_steps
    lines.append(f"# steps per run: {steps} (budget.max_steps)")
    unmapped = unmapped_step_count(sweep.spec, sweep.space, sweep.base_config)
    if unmapped is not None:
        lines.append(f"# WARNING: {unmapped[0]} below is {unmapped[1]}, not the {steps} steps "
                     f"these values ran and held at: train {steps} steps")
    return "\n".join(lines) + "\n"


def suffix(sweep: Sweep) -> str:
    """The file suffix of a handed-over config: ``.json`` or ``.yaml``."""
    return ".json" if sweep.config_format == "json" else ".yaml"


def handed_over(folder: Path) -> list[Path]:
    """The configs in ``folder``, ``rank-*.yaml`` or ``rank-*.json``, in rank order."""
    return sorted(p for p in folder.glob("rank-*") if p.suffix in (".yaml", ".json"))


def header_lines(path: Path) -> list[str]:
    """The comment lines at the top of a written config (of a JSON one: in its
    ``.header`` file), without their ``# ``."""
    if path.suffix == ".json":
        path = path.with_suffix(".header")
        if not path.is_file():
            return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        out.append(line.lstrip("# "))
    return out


def worse_than_base(path: Path) -> str | None:
    """The header's warning when the config is worse than the base config, else None."""
    return next((line for line in header_lines(path) if WORSE_THAN_BASE in line), None)


def base_not_compared(path: Path) -> str | None:
    """The header's line saying the base config went unstable on every seed it ran, so
    the config is not compared with it, else None."""
    return next((line.removeprefix("base config: ") for line in header_lines(path)
                 if BASE_NOT_COMPARED in line), None)


def base_held(path: Path) -> str | None:
    """The header's line saying the config is your base config (it held and nothing beat
    it), else None."""
    return next(("your base config " + line.removeprefix("your base config: ")
                 for line in header_lines(path) if line.startswith("your base config: ")),
                None)


def flag_lines(sweep: Sweep, config: Any, dashes: bool = False,
               options: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """A handed-over ``config``'s knob values (and step count) as command-line flags for a
    script that takes them as argparse options, ``--<path>=<value>`` one a line (the
    option string ``options`` gives for the write-back path, its argparse ``dest``; else
    the path itself, with ``dashes`` its ``_`` as ``-``); and the paths left out (a value
    that is no number, text or bool: null, a list)."""
    from sweeps.spec.config_paths import get_path

    paths = [sweep.spec.write_back[k] for k in sweep.space if k not in sweep.grouped]
    paths += sweep.steps_paths
    lines, skipped = [], []
    for path in paths:
        value = get_path(config, path, None) if isinstance(config, dict) else None
        if not isinstance(value, (bool, int, float, str)):  # null, a list, a mapping
            skipped.append(path)
            continue
        flag = (options or {}).get(path) or "--" + (path.replace("_", "-") if dashes else path)
        lines.append(f"{flag}={flag_text(value)}")
    return lines, skipped


def parser_options(sweep: Sweep) -> dict[str, str]:
    """The option string of each ``dest`` of the argparse parser the trainer's module holds
    (``from train import parser`` in the trainer of docs/trainers.md): ``batch_size`` ->
    ``--batch-size``, as the script spells it; empty when the module cannot be imported
    or holds no parser. What the module prints on import goes to stderr."""
    import contextlib
    import sys

    from sweeps.spec.argparse_options import option_strings, parser_of
    from sweeps.spec.trainer_loader import load_trainer

    try:
        with contextlib.redirect_stdout(sys.stderr):
            fn = load_trainer(sweep.spec.trainer, sweep.trainer_paths)
    except Exception:  # noqa: BLE001 - no parser to read: the write-back keys are the flags
        return {}
    parser = parser_of(fn)
    return option_strings(parser) if parser is not None else {}


def write_config(path: Path, sweep: Sweep, values: dict[str, Any],
                 provenance: dict[str, Any]) -> Path:
    """Write one exported config atomically, and beside it (``.overrides``) the same knob
    values as the override list a Hydra user passes on the command line, one override a
    line (a text value may hold a space: read the lines, do not split them); a JSON config's
    header goes to ``.header`` beside it. Returns the config's path."""
    if path.suffix == ".json":
        write_text(path.with_suffix(".header"), header(sweep, provenance))
        write_text(path, render_json(sweep, values))
    else:
        write_text(path, render(sweep, values, provenance))
    groups = sweep.groups.overrides(values) if sweep.groups else []
    listed = groups + overrides(sweep.base_for(values), sweep.values_by_path(values))
    write_text(path.with_suffix(".overrides"), "".join(f"{o}\n" for o in listed))
    return path
