"""``sweeps stability``: run the grid on Ray and write stability.csv / .md (and a map), or
with ``--probe`` search the boundary one trial at a time and write boundary.md."""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from sweeps.errors import SpecError
from sweeps.protocol import CRASH, SEED_KEY, STABILITY, STATUS_KEY
from sweeps.record import objectives
from sweeps.record.book import TrialBook, books_of, open_book
from sweeps.results import boundary, stability
from sweeps.results.files import write_csv, write_histories
from sweeps.spec.loader import Sweep
from sweeps.spec.trainer_loader import load_trainer
from sweeps.state.atomic import write_text
from sweeps.state.folder_lock import claim
from sweeps.terminal import clean, echo, echo_stderr
from sweeps.trial.failures import error_line
from sweeps.trial.gpu import trial_device
from sweeps.trial.run import prepare_process, run_trainer, trial_values
from sweeps.trial.tryout import check_knob_value, parse_sets, try_values
from sweeps.tune.experiments import run_configs
from sweeps.tune.session import check_address, ray_running

if TYPE_CHECKING:
    from sweeps.results.sharpness import Sharpness

#: Where ``sweeps stability`` writes, under the sweep's results folder: its own place, so a
#: stability sweep and ``sweeps run`` of one sweep file never overwrite each other's files.
STABILITY_DIR = "stability"
#: Folder (under :data:`STABILITY_DIR`) for the stability runs' journals and histories.
FOLDER = "trials"


def stability_sweep(sweep: Sweep) -> Sweep:
    """``sweep`` writing into ``results/<name>/stability/``."""
    return replace(sweep, output_dir=sweep.output_dir / STABILITY_DIR)


@dataclass
class StabilityOutcome:
    """The table and what it recommends."""

    table: pd.DataFrame
    names: list[str]
    recommended: Any
    why: str
    clip: float | None
    clip_why: str
    boundary: tuple[Any, Any] | None
    boundary_text: str
    warnings: list[str]
    files: list[Path]
    quality_note: str = ""
    display: pd.DataFrame | None = None

    @property
    def clip_line(self) -> str:
        """The grad_clip line: a recommendation, or, when grad_clip is the knob the grid
        varied (the line above recommends it), what its grad norms suggest beside it."""
        value = "none" if self.clip is None else f"{self.clip:.3g}"
        if self.names[0] != "grad_clip":
            return f"recommended grad_clip: {value} ({self.clip_why})"
        if self.clip is None or self.clip == self.recommended:
            return f"grad norms: {self.clip_why}"
        return (f"grad norms suggest grad_clip {value}, which the grid did not test "
                f"({self.clip_why}): add it to --values to compare it with the grid's pick")


def _check_knob(sweep: Sweep, name: str, values: list[Any], flag: str) -> None:
    if name not in sweep.space:
        raise SpecError(flag, f"{name!r} is not a knob of the search space",
                        f"use one of {', '.join(sweep.space)}")
    if not values:
        raise SpecError(flag, "no values given", "give e.g. --values 1e-4,1e-3,1e-2")
    for i, value in enumerate(values):  # a value the trainer could not take is bad input
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(flag, f"{value} is no finite number", "give finite values")
        if value in values[:i]:
            raise SpecError(flag, f"{value!r} is listed twice (its seeds would run twice)",
                            "list each value once")
        check_knob_value(sweep, name, value, flag)


def check_grid(sweep: Sweep, param: str, values: list[Any],
               second: tuple[str, list[Any]] | None = None) -> None:
    """A SpecError for a grid the trainer could not run: a knob not in the space, a value
    it could not take, ``--and`` naming the knob ``--param`` varies. Before anything is
    written."""
    _check_knob(sweep, param, values, "--param")
    if second:
        if second[0] == param:
            raise SpecError("--and", f"names {param}, the knob --param already varies",
                            "give another knob, e.g. --and warmup=0,20")
        _check_knob(sweep, second[0], second[1], "--and")


def held_knobs(sweep: Sweep, pairs: Sequence[str], param: str, crossed: str | None,
               probing: bool = False) -> dict[str, Any]:
    """``sweeps stability --set KNOB=VALUE``: knobs held at a value in every run (a
    hand-over's, say) instead of the base config's; only knobs of the space, and not the
    ones the grid or probe varies (exit 2). With ``probing``, ``--set`` of the probed knob
    is where the probe starts (a hand-over's ``# knobs:`` line copied whole)."""
    sets = parse_sets(pairs)
    varied = {param if not probing else "", (crossed or "").partition("=")[0].strip()}
    for key in sets:
        if key not in sweep.space:
            raise SpecError(f"--set {key}", "is not a knob of the search space (stability "
                            "holds knobs only)", f"use one of {', '.join(sweep.space)}")
        if key in varied:
            raise SpecError(f"--set {key}", "is the knob this command varies",
                            f"drop --set {key}")
    values = try_values(sweep, sets)  # each value checked against its knob
    return {key: values[key] for key in sets}


def run_stability(sweep: Sweep, param: str, values: list[Any], *, seeds: int = 3,
                  second: tuple[str, list[Any]] | None = None, address: str | None = None,
                  progress: bool = True, fixed: dict[str, Any] | None = None
                  ) -> StabilityOutcome:
    """Run every grid value on ``seeds`` seeds and analyse the runs; ``sweep`` is the
    :func:`stability_sweep` (its output folder is the stability one); ``fixed``: other
    knobs' values for every run (``--set``), else the base config's."""
    check_grid(sweep, param, values, second)
    names = [param] + ([second[0]] if second else [])
    base = {k: v for k, v in try_values(sweep, dict(fixed or {})).items() if k not in names}
    runs = stability.plan(base, param, values, [sweep.spec.seed + i for i in range(seeds)], second)
    check_address(address)  # before the earlier grid's runs are removed
    # one owner per results folder; the earlier grid moves aside once Ray is up (a Ray
    # that does not start leaves it where it was)
    with claim(sweep.output_dir, "stability"), ray_running(address):
        kept = keep_previous_grid(sweep.output_dir)
        if kept is not None:
            echo_stderr(f"note: the previous grid's files were moved to {kept}")
        with books_of(sweep):
            book = open_book(sweep, FOLDER)
            run_configs(sweep, book, runs, "ray", progress=progress, stage=STABILITY)
            return write_stability(sweep, book, names, held=base, seeds=seeds)


#: A grid's own files in the stability folder (the preflight's and the probe's stay).
GRID_FILES = ("stability.csv", "stability.md", "stability_map.png", FOLDER)


def keep_previous_grid(out: Path, names: tuple[str, ...] = GRID_FILES,
                       kind: str = "grid") -> Path | None:
    """Move an earlier grid's files (or probe's: ``names``, ``kind``) into
    ``out/<kind>-<timestamp>/`` (a new one replaced them before), or None when there were
    none."""
    found = [out / name for name in names if (out / name).exists()]
    if not found:
        return None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target, n = out / f"{kind}-{stamp}", 1
    while target.exists():
        n += 1
        target = out / f"{kind}-{stamp}-{n}"
    target.mkdir(parents=True)
    for path in found:
        os.replace(path, target / path.name)
    return target


def quality_of(sweep: Sweep) -> stability.Quality | None:
    """The sweep's first objective, the quality the stability table reports."""
    first = sweep.objectives[0] if sweep.objectives else None
    return stability.Quality(first.metric, first.mode, sweep.quality_baseline) \
        if first else None


def write_stability(sweep: Sweep, book: TrialBook, names: list[str], *,
                    held: dict[str, Any] | None = None, seeds: int | None = None
                    ) -> StabilityOutcome:
    """stability.csv, stability.md and, for two knobs, stability_map.png; ``held``: the
    other knobs' values every run had, and ``seeds`` how many each cell ran, said in
    stability.md so a grid around a hand-over reads apart from one around the base
    config once the next grid moves it aside."""
    out = sweep.output_dir
    rows = stability.cells(book, names[0], names[1] if len(names) > 1 else None)
    quality = quality_of(sweep)
    records = stability.table_rows(rows, names, quality)
    table = pd.DataFrame(records)
    display = pd.DataFrame(stability.display_rows(records, quality))
    recommended, why = stability.recommend(rows, quality)
    note = stability.quality_note(rows, quality)
    clip, clip_why = stability.recommend_clip(rows, recommended, quality,
                                              clip_is_second=names[1:] == ["grad_clip"])
    below, above = stability.boundary(rows)
    warnings = stability.clip_warnings(rows)
    files = [out / "stability.csv", out / "stability.md"]
    write_csv(files[0], table)
    write_histories(out / FOLDER, book)
    md = [f"# Stability of {sweep.name} over {' × '.join(names)}", "",
          display.to_markdown(index=False), "",
          f"- {note}",
          f"- boundary: {_edge(below, above)}",
          f"- recommended {names[0]}: {stability.label((recommended,))} ({why})"]
    if held is not None:
        knobs = ", ".join(f"{k}={stability.label((v,))}" for k, v in sorted(held.items()))
        md.insert(2, f"Every run: {sweep.spec.budget.max_steps} steps"
                  + (f", {seeds} seed(s) per cell" if seeds else "")
                  + (f"; the other knobs held at {knobs} (`--set`, else the base "
                     "config's)" if knobs else "; no other knob searched") + ".\n")
    edge = (below.key[0] if below else None, above.key[0]) if above else None
    outcome = StabilityOutcome(table, names, recommended, why, clip, clip_why, edge,
                               _edge(below, above), warnings, files, note, display)
    md += [f"- {outcome.clip_line}"] + [f"- warning: {w}" for w in warnings]
    write_text(files[1], "\n".join(md) + "\n")
    if len(names) == 2:
        files.append(out / "stability_map.png")
        stability.draw_map(rows, names, files[-1], quality)
    return outcome


def _edge(below, above) -> str:
    if above is None:
        return "not found in the grid"
    low = stability.label(below.key[:1]) if below else "(none stable)"
    return f"between {low} and {stability.label(above.key[:1])} ({above.verdict()})"


# -- the boundary probe (``--probe``) ---------------------------------------------------------

#: The probe's report, under :data:`STABILITY_DIR`.
BOUNDARY_FILE = "boundary.md"


def probe_range(sweep: Sweep, param: str, text: str | None) -> tuple[float, float]:
    """``--range LOW:HIGH``, else the search space's range of ``lr``; a SpecError otherwise."""
    _check_knob(sweep, param, [1], "--param")
    if text:
        low, sep, high = text.partition(":")
        try:
            lo, hi = float(low), float(high)
        except ValueError:
            lo = hi = -1.0
        if not sep or not 0 < lo < hi:
            raise SpecError("--range", f"{text!r} is not 0 < LOW < HIGH",
                            "write e.g. --probe --range 1e-5:10")
        return lo, hi
    knob = sweep.space.get(param)
    low, high = getattr(knob, "low", None), getattr(knob, "high", None)
    if param != "lr" or not isinstance(low, (int, float)) or not isinstance(high, (int, float)) \
            or not 0 < low < high:
        raise SpecError("--probe", f"no range to probe {param!r} in (only lr's range in the "
                        "search space is used, and it must be numeric with 0 < low < high)",
                        "give the range: --range LOW:HIGH, e.g. --range 1e-5:10")
    return float(low), float(high)


def run_probe(sweep: Sweep, param: str, rng: tuple[float, float], *, seeds: int = 3,
              echo: Callable[[str], None] | None = None, predict: bool = True,
              verify_steps: int | None = None, fixed: dict[str, Any] | None = None,
              write: bool = True) -> boundary.Boundary:
    """Probe the boundary of ``param`` one trial at a time in this process (no Ray) and
    write ``boundary.md``; ``sweep`` is the :func:`stability_sweep`, its budget the steps.

    With ``predict`` and ``param`` ``lr``, a trainer module that defines
    ``loss_closure(config)`` has its sharpness estimated at the base config first, and the
    bracket starts at the predicted boundary (:mod:`sweeps.results.sharpness`).
    ``verify_steps``: afterwards, runs of that length at the interval's two ends
    (:func:`sweeps.results.boundary.verify`). ``fixed``: other knobs' values for every
    run (``--and``); ``write``: write ``boundary.md`` (a crossed probe writes one file
    for all its values)."""
    _check_knob(sweep, param, [1], "--param")
    if seeds < 1:
        raise SpecError("--seeds", f"{seeds} is below 1", "give e.g. --seeds 3")
    base = try_values(sweep, dict(fixed or {}))
    start = base.get(param)
    origin = "--set" if param in (fixed or {}) else "the base config's"
    if not isinstance(start, (int, float)) or isinstance(start, bool) or not start > 0:
        start, origin = math.sqrt(rng[0] * rng[1]), "the middle of the range"
    prepare_process(sweep, int(sweep.spec.resources.cpu), shared_cache=False)
    say = echo or (lambda line: None)
    seed_list = [sweep.spec.seed + i for i in range(seeds)]
    predicted, note = predict_boundary(sweep, base, seed_list[0]) \
        if predict and param == "lr" else (None, None)
    if predicted is not None:
        say(predicted.line(param))
        start, origin = predicted.predicted, "predicted from the sharpness"
    elif note:
        say(note)

    learnt: list[float] = []  # values where a run held and left the random guess

    def run(value: float, seed: int, length: int | None = None) -> boundary.SeedRun:
        one = _probe_run(sweep, {**base, param: value, SEED_KEY: seed}, length,
                         hold=length is None)
        if one.held and not one.slow:
            learnt.append(value)
        elif one.held and any(v < value for v in learnt):  # stuck above a value that learnt
            one = boundary.SeedRun(False, one.steps, "flat_at_baseline", one.steps)
        why = "held" if one.held else f"failed: {one.reason} at step {one.stop_step}"
        say(f"{'verify' if length else 'probe'} {param}={value:.4g} seed {seed}: {why} "
            f"({one.steps} steps)")
        return one

    steps = int(sweep.spec.budget.max_steps)
    with claim(sweep.output_dir, "stability"):  # marks and holds the stability folder
        result = boundary.probe(run, float(start), *rng, seeds=seed_list, steps_per_run=steps,
                                first=boundary.RATIO if predicted is not None and
                                predicted.exact else None)
        result.prediction, result.prediction_note = predicted, note
        if verify_steps:
            result.verified = boundary.verify(
                lambda value, seed: run(value, seed, verify_steps), result, seed_list,
                verify_steps)
        if write:
            md = [f"# Stability boundary of {sweep.name} in {param}", "",
                  held_line(sweep, base, param, fixed or {}, start, origin), "",
                  *boundary.summary(result, param), "", "Probes:", "",
                  *boundary.probe_lines(result)]
            write_text(sweep.output_dir / BOUNDARY_FILE, "\n".join(md) + "\n")
    return result


def held_line(sweep: Sweep, base: dict[str, Any], param: str, fixed: dict[str, Any],
              start: float, origin: str) -> str:
    """What every probe run had besides ``param``: the other knobs' values (``--set``, else
    the base config's) and where the bracket started, so a probe around a hand-over reads
    apart from one around the base config."""
    others = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in base.items() if k != param)
    given = [k for k in fixed if k != param]
    source = (f"--set {', '.join(given)}, the rest the base config's" if given
              else "the base config's")
    return (f"Every run: {others or 'no other knob'} ({source}); the bracket started at "
            f"{param}={start:.4g} ({origin}), {sweep.spec.budget.max_steps} steps at most "
            "per run.")


def crossed_lines(param: str, name: str, results: list[tuple[Any, boundary.Boundary]]
                  ) -> list[str]:
    """A crossed probe's answer (``--and``): one boundary per value of the second knob,
    then a line each for the summary table."""
    out: list[str] = []
    for value, result in results:
        out += [f"## {name} = {value}", "", *boundary.summary(result, param), "",
                *boundary.probe_lines(result), ""]
    out.append(f"{name:>10}  {param} held   {param} failed  steps")
    for value, result in results:
        low = "none" if result.low is None else f"{result.low:.4g}"
        high = "none" if result.high is None else f"{result.high:.4g}"
        out.append(f"{value!s:>10}  {low:>9}  {high:>9}  {result.steps}")
    return out


def predict_boundary(sweep: Sweep, base: dict[str, Any],
                     seed: int) -> tuple[Sharpness | None, str | None]:
    """The sharpness estimate at the base config when the trainer module defines
    ``loss_closure(config)``: (the estimate, None), (None, why it gave none) when the hook
    failed, (None, None) without the hook. The hook gets the config a trial at ``base``
    with ``seed`` gets; torch's global RNG is left as it was."""
    import torch  # only here: the command module stays light

    from sweeps.results import sharpness

    load_trainer(sweep.spec.trainer, sweep.trainer_paths)  # the module the runs will import
    module = importlib.import_module(sweep.spec.trainer.partition(":")[0])
    hook = getattr(module, sharpness.HOOK, None)
    if hook is None:
        return None, None
    if not callable(hook):
        return None, (f"predicted: none: {sharpness.HOOK} in the trainer module is not a "
                      "function; the bracket starts at the base config's value")
    config = sweep.trial_config(trial_values(sweep, {**base, SEED_KEY: seed}),
                                trial_id="sharpness", seed=seed)
    config["sweep"].update(checkpoint=None, device=trial_device(
        [], gpu_requested=sweep.spec.resources.gpu > 0))
    try:
        with torch.random.fork_rng(devices=[]):
            return sharpness.from_hook(hook(config)), None
    except Exception as exc:  # noqa: BLE001 - the user's hook: the probe goes on without it
        return None, (f"predicted: none: {sharpness.HOOK} failed ({clean(error_line(exc))}); "
                      "the bracket starts at the base config's value")


def _probe_run(sweep: Sweep, config: dict[str, Any], max_steps: int | None = None, *,
               hold: bool = False) -> boundary.SeedRun:
    """One run (a rule stops it at its verdict; ``max_steps``: another length than the
    budget's; ``hold``: it ends once the rules could tell, :mod:`sweeps.trial.horizon`):
    it fails when a rule gave an instability verdict other than a slow one (as the
    grid's ``explodes``/``borderline``; a slow one held, marked ``slow``: the probe fails
    it above a value that learnt, where an LR too high to learn is the edge); a crash
    (a trainer error, not instability) is raised as a RuntimeError."""
    final: dict[str, Any] = {}
    reporter = run_trainer(sweep, config, "probe", final.update, max_steps=max_steps,
                           hold=hold)
    steps = int(reporter.history[-1].get("step", len(reporter.history))) \
        if reporter.history else 0
    verdict = reporter.verdict
    if final.get(STATUS_KEY) == CRASH:
        raise RuntimeError(f"the trainer crashed at {config} (not an instability): "
                           f"{verdict.summary() if verdict else 'no verdict'}")
    if verdict is None or stability.slow(verdict.reason, verdict.evidence):
        norms = tuple(objectives.series(reporter.history, "grad_norm"))
        return boundary.SeedRun(True, steps, grad_norms=norms, slow=verdict is not None)
    return boundary.SeedRun(False, steps, verdict.reason, int(verdict.step))


def _crossed(sweep: Sweep, param: str, text: str | None) -> tuple[str, list[Any]] | None:
    """``--and KNOB=v1,v2`` with ``--probe``: the knob whose values each get a probe of
    ``param``; None without it; a SpecError naming the flag otherwise."""
    if not text:
        return None
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not rest.strip():
        raise SpecError("--and", f"{text!r} is not NAME=v1,v2", "write e.g. --and "
                        "grad_clip=0,1,5")
    if name == param:
        raise SpecError("--and", f"{name!r} is the probed knob itself",
                        "cross another knob, e.g. --and grad_clip=0,1,5")
    values = stability.parse_values(rest)
    _check_knob(sweep, name, values, "--and")
    return name, values


def cmd_probe(args: Any) -> int:
    """``sweeps stability FILE --param P --probe``: flags checked, probe run (``--verify``:
    then full-length runs at the interval's ends, the sweep's ``budget.max_steps`` even
    with ``--steps``), answer printed (plain text, or JSON with ``--format json``); 1 when
    the trainer crashed (a disagreeing ``--verify`` is said, and still exits 0)."""
    import json
    import sys

    from sweeps.commands.preflight_step import preflight
    from sweeps.spec.loader import load_sweep
    from sweeps.trial.tryout import _with_budget

    if args.values:
        raise SpecError("--values", "does not go with --probe (the probe picks its own "
                        "values of --param)", "drop --values, or drop --probe to run a grid")
    sweep = load_sweep(args.file, workdir=Path.cwd())
    held = held_knobs(sweep, args.set or [], args.param, args.and_, probing=True)
    crossed = _crossed(sweep, args.param, args.and_)
    full = int(sweep.spec.budget.max_steps)
    if args.steps:
        sweep = _with_budget(sweep, args.steps)
    rng = probe_range(sweep, args.param, args.range)

    def say(line: str) -> None:
        if not args.quiet:
            echo(line, file=sys.stderr)

    with claim(sweep.output_dir, "stability"):
        sweep = stability_sweep(sweep)
        kept = keep_previous_grid(sweep.output_dir, (BOUNDARY_FILE,), "probe")
        if kept is not None:
            echo_stderr(f"note: the previous probe's {BOUNDARY_FILE} was moved to {kept}")
        if not args.no_preflight:
            sweep = preflight(sweep)
        options = dict(seeds=args.seeds, echo=say, predict=not args.no_sharpness,
                       verify_steps=full if args.verify else None)
        try:
            if crossed is not None:
                name, values = crossed
                results = [(v, run_probe(sweep, args.param, rng, fixed={**held, name: v},
                                         write=False, **options)) for v in values]
            else:
                result = run_probe(sweep, args.param, rng, fixed=held, **options)
        except RuntimeError as exc:  # a trainer's error text: printed as text
            echo(f"error: {exc}", file=sys.stderr)
            return 1
        if crossed is not None:
            lines = crossed_lines(args.param, name, results)
            write_text(sweep.output_dir / BOUNDARY_FILE, "\n".join(
                [f"# Stability boundary of {sweep.name} in {args.param}, per {name}", "",
                 *lines]) + "\n")
    if crossed is not None:
        if args.format == "json":
            print(json.dumps({"param": args.param, "crossed": name, "rows": [
                {name: v, **r.as_dict()} for v, r in results]}, indent=2))
        else:
            echo("\n".join([*lines, f"written: {sweep.output_dir / BOUNDARY_FILE}"]))
        return 0
    if args.format == "json":
        print(json.dumps(result.as_dict(), indent=2))
        why = result.verified.disagreement(args.param) if result.verified else None
        if why:  # stdout stays JSON: the disagreement is said on stderr too
            print(f"disagrees: {why}", file=sys.stderr)
    else:
        echo("\n".join([*boundary.summary(result, args.param), *boundary.probe_lines(result),
                        f"written: {sweep.output_dir / BOUNDARY_FILE}"]))
    return 0
