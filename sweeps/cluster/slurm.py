"""``sweeps slurm FILE``: validate a sweep here, render its sbatch script, submit it."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps.cluster.slurm_render import TEMPLATE, JobOptions, port_block, render, validate
from sweeps.errors import SpecError

if TYPE_CHECKING:
    from sweeps.spec.loader import Sweep


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``sweeps slurm``."""
    p = sub.add_parser("slurm", help="run a sweep as a SLURM job: Ray over the allocation")
    p.add_argument("file", nargs="?", help="sweep file (YAML); not with --resume")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the sweep in this results folder (a job that was "
                   "cancelled, timed out or failed) instead of starting one")
    p.add_argument("--nodes", type=int, default=1, help="nodes (Ray head + workers); default 1")
    p.add_argument("--cpus-per-node", type=int, default=None,
                   help="CPUs Ray uses per node (default: resources.cpu x the trials that "
                   "run at once on a node, from budget.concurrent)")
    p.add_argument("--gpus-per-node", type=int, default=0,
                   help="GPUs per node (--gres=gpu:G); each trial gets 1 unless the sweep says")
    p.add_argument("--time", default=None,
                   help="time limit, [D-]HH:MM:SS (default: the partition's)")
    p.add_argument("--partition", default=None, help="(default: the cluster's default)")
    p.add_argument("--account", default=None)
    p.add_argument("--output-dir", default=None,
                   help="results root on a path every node sees (default: the sweep's output:)")
    p.add_argument("--port-base", type=int, default=None,
                   help="first port of this job's block (default: from the job id)")
    p.add_argument("--no-auth", action="store_true", help="no Ray token authentication")
    p.add_argument("--template", default=None, help=f"sbatch template (default: {TEMPLATE})")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    p.set_defaults(func=cmd_slurm)


@dataclass
class Plan:
    """What a submission writes: the script, and the GPU copy of the sweep if any."""

    script: str
    script_path: Path
    sweep_file: Path
    override: str | None
    results: Path
    notes: list[str]


def plan(args: argparse.Namespace, opts: JobOptions, workdir: Path) -> Plan:
    """Validate the sweep and the options here and render the script; nothing is written.
    ``workdir`` is the folder sweeps was started from: the job runs there."""
    sweep, resume = _sweep_of(args, workdir)
    defaulted = _defaults_noted(opts)
    if opts.cpus_per_node is None:
        cpus = default_cpus(sweep, opts.nodes)
        opts = replace(opts, cpus_per_node=cpus)
        defaulted.append(f"--cpus-per-node not given: {cpus} (resources.cpu "
                         f"{sweep.spec.resources.cpu:g} x budget.concurrent "
                         f"{sweep.spec.budget.concurrent} over {opts.nodes} node(s))")
    validate(opts)
    _check_resources(sweep.spec.resources.cpu, sweep.spec.resources.gpu, opts)
    template = _read_template(args.template)
    if not args.dry_run and opts.partition is not None:
        _check_partition(opts.partition)
    results = sweep.output_dir.parent
    folder = results / f"{sweep.name}.slurm"
    if resume is not None and opts.gpus_per_node and sweep.spec.resources.gpu == 0:
        raise SpecError("--gpus-per-node", "a resumed sweep keeps the resources it ran with "
                        "(resources.gpu 0)", "leave --gpus-per-node out, or run the sweep "
                        "again with GPUs")
    _check_path("working directory", workdir)
    _check_path("--output-dir", folder)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    sweep_file, override, pythonpath = sweep.source or workdir / (args.file or ""), None, ""
    if opts.gpus_per_node and sweep.spec.resources.gpu == 0:
        override = gpu_override(sweep)
        sweep_file = folder / f"sweep-{stamp}.yaml"
        pythonpath = os.pathsep.join(sweep.trainer_paths)
    script = render(template, opts, name=sweep.name, python=sys.executable, ray=_ray_command(),
                    sweep_file=sweep_file, results=results, workdir=workdir,
                    log=folder / "slurm-%j.out", pythonpath=pythonpath, resume=resume)
    return Plan(script=script, script_path=folder / f"sweep-{stamp}.sbatch",
                sweep_file=sweep_file, override=override, results=sweep.output_dir,
                notes=defaulted + _notes(sweep, opts, override is not None))


def _sweep_of(args: argparse.Namespace, workdir: Path) -> tuple[Sweep, Path | None]:
    """The sweep file's sweep, or with ``--resume`` the one saved in that results folder
    (and the folder)."""
    from sweeps.spec.loader import load_sweep

    resume = getattr(args, "resume", None)  # plan() called with a sweep file's arguments
    if resume is None:
        if not args.file:
            raise SpecError("FILE", "no sweep file given", "give a sweep file, or --resume "
                            "DIR to continue the sweep in a results folder")
        return load_sweep(args.file, workdir=workdir, output=args.output_dir), None
    if args.file or args.output_dir:
        raise SpecError("--resume", "continues the sweep saved in its results folder, so it "
                        "takes no sweep file or --output-dir", "leave them out")
    from sweeps.commands.run import load_resolved

    folder = (workdir / Path(resume).expanduser()).resolve()
    return load_resolved(folder), folder


def cmd_slurm(args: argparse.Namespace) -> int:
    """Validate, render, write (atomically) and submit; print how to follow the job."""
    from sweeps.state.atomic import write_text

    opts = JobOptions(nodes=args.nodes, cpus_per_node=args.cpus_per_node,
                      gpus_per_node=args.gpus_per_node, time=args.time,
                      partition=args.partition, account=args.account,
                      port_base=args.port_base, auth=not args.no_auth)
    job = plan(args, opts, Path.cwd())
    if args.dry_run:
        print(job.script, end="")
        for note in job.notes:
            print(f"note: {note}", file=sys.stderr)
        print(f"dry run: nothing written or submitted ({job.script_path} when submitted)",
              file=sys.stderr)
        return 0
    written = [job.script_path] + ([job.sweep_file] if job.override is not None else [])
    try:
        if job.override is not None:
            write_text(job.sweep_file, job.override)
        write_text(job.script_path, job.script)
        job.script_path.chmod(0o755)
    except OSError as exc:
        raise SpecError("--output-dir", f"cannot write {job.script_path.parent} "
                        f"({exc.strerror or exc})", "give a results folder you can write to, "
                        "on a filesystem every node mounts") from exc
    done = subprocess.run(["sbatch", "--parsable", str(job.script_path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        for path in written:
            path.unlink(missing_ok=True)
        print(f"error: sbatch refused the job: {done.stderr.strip()}", file=sys.stderr)
        return 1
    _print_follow(done.stdout.strip().split(";")[0], opts, job)
    return 0


def gpu_override(sweep: Sweep) -> str:
    """The sweep made self-contained (base config, space inline) with one GPU per trial."""
    import yaml

    from sweeps.spec.loader import load_sweep_dict

    data = sweep.resolved()
    data["resources"]["gpu"] = 1
    load_sweep_dict(data, base_dir=sweep.base_dir, workdir=sweep.workdir, import_trainer=False)
    return yaml.safe_dump(data, sort_keys=False)


def default_cpus(sweep: Sweep, nodes: int) -> int:
    """CPUs per node for the trials that run at once: resources.cpu x budget.concurrent,
    spread over the nodes (at least one trial's worth)."""
    per_node = -(-sweep.spec.budget.concurrent // nodes)
    return max(1, math.ceil(sweep.spec.resources.cpu * per_node))


def _defaults_noted(opts: JobOptions) -> list[str]:
    notes = []
    if opts.time is None:
        notes.append("--time not given: no #SBATCH --time line, so the partition's default "
                     "time limit applies (the sweep is told to stop 120 s before it)")
    if opts.partition is None:
        notes.append("--partition not given: no #SBATCH --partition line, so the cluster's "
                      "default partition is used")
    return notes


def _check_resources(cpu: float, gpu: float, opts: JobOptions) -> None:
    if cpu > opts.cpus_per_node:
        raise SpecError("resources.cpu", f"a trial needs {cpu:g} CPUs, a node has "
                        f"{opts.cpus_per_node}", "raise --cpus-per-node or lower resources.cpu")
    if gpu > opts.gpus_per_node:
        raise SpecError("resources.gpu", f"a trial needs {gpu:g} GPUs, a node has "
                        f"{opts.gpus_per_node}", "raise --gpus-per-node or lower resources.gpu")


def _read_template(path: str | None) -> str:
    file = Path(path) if path else TEMPLATE
    try:
        return file.read_text()
    except OSError as exc:
        raise SpecError("--template", f"cannot read {file} ({exc.strerror or exc})",
                        "give the path of an sbatch template, e.g. a copy of "
                        f"{TEMPLATE}") from exc


def _check_partition(partition: str) -> None:
    if shutil.which("sbatch") is None:
        raise SpecError("sbatch", "not found on PATH", "run on a SLURM login node, "
                        "or add --dry-run to see the script")
    if shutil.which("sinfo") is None:
        return
    out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True)
    known = sorted(set(out.stdout.split()))
    if out.returncode == 0 and known and not set(partition.split(",")) <= set(known):
        raise SpecError("--partition", f"no partition {partition!r} on this cluster",
                        f"use one of {', '.join(known)}")


def _check_path(key: str, path: Path) -> None:
    if any(c.isspace() or c == "%" for c in str(path)):
        raise SpecError(key, f"{path} holds whitespace or '%', which #SBATCH lines cannot "
                        "carry", "use a path without them")


def _ray_command() -> list[str]:
    ray = Path(sys.executable).parent / "ray"
    return [str(ray)] if ray.is_file() else [sys.executable, "-m", "ray.scripts.scripts"]


def _notes(sweep: Sweep, opts: JobOptions, gpu_override: bool) -> list[str]:
    res, budget = sweep.spec.resources, sweep.spec.budget
    per_node = int(opts.cpus_per_node // res.cpu)
    gpu = 1.0 if gpu_override else res.gpu
    if gpu:
        per_node = min(per_node, int(opts.gpus_per_node // gpu))
    slots = per_node * opts.nodes
    notes = []
    if gpu_override:
        notes.append("the sweep asks for no GPU: each trial gets 1 GPU here (resources.gpu: 1)")
    if budget.concurrent < slots:
        notes.append(f"budget.concurrent is {budget.concurrent}: {slots} trials would fit at once")
    elif budget.concurrent > slots:
        notes.append(f"budget.concurrent is {budget.concurrent}, but only {slots} trials fit at "
                     "once on this allocation")
    if str(sweep.output_dir).startswith("/tmp/") and opts.nodes > 1:
        notes.append(f"results go to {sweep.output_dir}: every node must see this path")
    return notes


def _print_follow(job: str, opts: JobOptions, plan: Plan) -> None:
    block, slots = port_block(opts.cpus_per_node)
    base = opts.port_base if opts.port_base is not None else 20000 + (int(job) % slots) * block
    log = plan.script_path.parent / f"slurm-{job}.out"
    print(f"submitted batch job {job}")
    print(f"  script:    {plan.script_path}")
    print(f"  follow:    squeue -j {job}   scontrol show job {job}   tail -f {log}")
    print(f"  results:   {plan.results}")
    print(f"  ports:     {base}-{base + block - 1} (head {base}, dashboard {base + 1})")
    print(f"  dashboard: ssh -L 8265:127.0.0.1:{base + 1} <head node>, then "
          f"http://localhost:8265 (head node: first of squeue -j {job} -h -o %N)")
    if opts.auth:
        token_dir = os.environ.get("SWEEPS_TOKEN_DIR", "~/.sweeps")
        print(f"  token:     {token_dir}/ray-token-{job}-* while the job runs (Ray token auth)")
    print(f"  cancel:    scancel {job} (the script stops Ray on every node and keeps results)")
    print(f"  continue:  sweeps slurm --resume {plan.results} (after a cancel, a time limit or "
          "a failure; the same options)")
    for note in plan.notes:
        print(f"note: {note}")
