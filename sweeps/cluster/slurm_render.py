"""Rendering ``sweeps/cluster/sweep.sbatch``: job options, the port block, the filled-in script."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from sweeps.errors import SpecError

#: The template `sweeps slurm` fills in, shipped inside the package (so a wheel has it too;
#: ``cluster/slurm/sweep.sbatch`` in a checkout links to it); ``--template`` overrides it.
TEMPLATE = Path(__file__).resolve().with_name("sweep.sbatch")
PORT_FLOOR = 20000
#: Default port blocks stay below 32768, where Linux starts handing out ephemeral ports.
PORT_CEILING = 32768
SERVICE_PORTS = 10  # head, dashboard, object/node manager, agent x2, metrics, runtime env, spare
_TIME = re.compile(r"(?:(\d+)-)?(\d{1,3}):(\d{2}):(\d{2})")
_WORD = re.compile(r"[A-Za-z0-9_.,+-]+")
_FIELD = re.compile(r"@@([A-Z_]+)@@")


@dataclass(frozen=True)
class JobOptions:
    """What the user asked SLURM for."""

    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    time: str | None  # None: the partition's default time limit
    partition: str | None  # None: the cluster's default partition
    account: str | None = None
    port_base: int | None = None
    auth: bool = True


def time_seconds(value: str) -> int:
    """``[D-]HH:MM:SS`` in seconds; anything else is a SpecError."""
    m = _TIME.fullmatch(value)
    if not m or int(m.group(3)) >= 60 or int(m.group(4)) >= 60:
        raise SpecError("--time", f"{value!r} is not [D-]HH:MM:SS",
                        "write e.g. --time 04:00:00 or --time 1-12:00:00")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def port_block(cpus_per_node: int) -> tuple[int, int]:
    """Ports per job (services + Ray worker ports) and how many such blocks fit by default."""
    block = max(100, -(-(SERVICE_PORTS + cpus_per_node + 32) // 100) * 100)
    return block, max(1, (PORT_CEILING - PORT_FLOOR) // block)


def validate(opts: JobOptions) -> None:
    """Check the job options; raise SpecError naming the option and the fix."""
    for key, value, low in (("--nodes", opts.nodes, 1), ("--cpus-per-node", opts.cpus_per_node, 1),
                            ("--gpus-per-node", opts.gpus_per_node, 0)):
        if value < low:
            raise SpecError(key, f"{value} is below {low}", f"give {key} {max(low, 1)} or more")
    if opts.time is not None and time_seconds(opts.time) < 300:
        raise SpecError("--time", f"{opts.time} is under 5 minutes", "give at least 00:05:00: "
                        "the job is told to stop 120 s before its time limit")
    for key, value in (("--partition", opts.partition), ("--account", opts.account)):
        if value is not None and not _WORD.fullmatch(value):
            raise SpecError(key, f"{value!r} is not a SLURM name",
                            "use letters, digits, '_', '-', '.' (',' between partitions)")
    block, _ = port_block(opts.cpus_per_node)
    if opts.port_base is not None and not 1024 <= opts.port_base <= 65535 - block:
        raise SpecError("--port-base", f"{opts.port_base} leaves no room for {block} ports",
                        f"give a port between 1024 and {65535 - block}")


def sbatch_lines(opts: JobOptions) -> str:
    """The optional ``#SBATCH`` lines (account, GPUs)."""
    lines = []
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if opts.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{opts.gpus_per_node}")
    return "\n".join(lines)


def render(template: str, opts: JobOptions, *, name: str, python: str, ray: list[str],
           sweep_file: Path, results: Path, workdir: Path, log: Path,
           pythonpath: str = "", resume: Path | None = None) -> str:
    """Fill in the template's ``@@FIELD@@``s; a field the template lacks or we lack is an
    error. A line holding a field the user left to SLURM's defaults (``--time``,
    ``--partition``) is left out."""
    block, slots = port_block(opts.cpus_per_node)
    q = shlex.quote
    fields = {
        "JOB_NAME": f"sweeps-{name}", "NODES": str(opts.nodes), "CPUS": str(opts.cpus_per_node),
        "GPUS": str(opts.gpus_per_node), "TIME": opts.time, "PARTITION": opts.partition,
        "WORKDIR": str(workdir), "LOG": str(log), "EXTRA_SBATCH": sbatch_lines(opts),
        "PYTHON": q(python), "RAY": " ".join(q(a) for a in ray), "SWEEP_FILE": q(str(sweep_file)),
        "RESULTS": q(str(results)),
        "RESULTS_DIR": q(str(resume if resume is not None else results / name)),
        "AUTH": "token" if opts.auth else "disabled", "PYTHONPATH": q(pythonpath),
        "PORT_BLOCK": str(block), "PORT_SLOTS": str(slots),
        "PORT_BASE": "" if opts.port_base is None else str(opts.port_base),
        "RESUME": q(str(resume)) if resume is not None else "''",
    }
    if resume is not None and "@@RESUME@@" not in template:
        raise SpecError("--template", "has no @@RESUME@@ field, so the job would start the "
                        "sweep over instead of resuming it", f"copy the RESUME lines of "
                        f"{TEMPLATE} into your template")
    missing = set(_FIELD.findall(template)) - set(fields)
    if missing:
        raise SpecError("--template", f"unknown field(s) {', '.join(sorted(missing))}",
                        f"use the fields of {TEMPLATE}")
    unset = [k for k, v in fields.items() if v is None]  # left to the site's SLURM defaults
    template = "".join(line for line in template.splitlines(keepends=True)
                       if not any(f"@@{k}@@" in line for k in unset))
    text = template.replace("@@EXTRA_SBATCH@@\n", fields["EXTRA_SBATCH"] + "\n"
                            if fields["EXTRA_SBATCH"] else "")
    return _FIELD.sub(lambda m: fields[m.group(1)], text)
