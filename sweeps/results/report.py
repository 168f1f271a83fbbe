"""The sweep report: a self-contained report.html with its PNG plots beside it, and
``summary(folder)``, the same content as plain data (for ``sweeps report --format json``)."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import yaml

from sweeps.protocol import (
    BASE_CONFIG,
    FAILED,
    OBJECTIVE_PREFIX,
    OK,
    PRUNED,
    PRUNED_LABEL_PREFIX,
    SEARCH,
    SELECTION,
    SELECTION_REASON,
    WARM_START,
    confirm_role,
    objective_column,
    seed_column_prefix,
)
from sweeps.results import plots
from sweeps.results.export import worse_than_base
from sweeps.results.files import cell_text
from sweeps.results.importance import importance
from sweeps.state.atomic import write_text
from sweeps.state.layout import SELECTION_NOTES

META = ("trial_id", "role", "status", "reason", "stop_step", "seed", "steps", "retries")
MAX_FAILED_CURVES, MAX_TOP_CURVES = 8, 5
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]+")
_PLOT_GLOBS = ("pareto.png", "seeds.png", "stability-*.png", "curves-*.png")


@dataclass
class Results:
    """A finished sweep folder, read leniently."""

    folder: Path
    name: str
    trials: pd.DataFrame
    pareto: pd.DataFrame
    objectives: list[str]
    modes: dict[str, str]
    knobs: list[str]
    kinds: dict[str, str]
    stable: list[str]
    seed: int = 0
    baseline: float | None = None
    space: dict[str, dict[str, Any]] = field(default_factory=dict)  # knob -> its entry
    notes: list[str] = field(default_factory=list)  # why confirmation stopped early, if it did

    @property
    def categorical(self) -> set[str]:
        return {k for k, kind in self.kinds.items() if kind == "categorical"}

    @property
    def search(self) -> pd.DataFrame:
        return self.trials[self.trials["role"] == SEARCH]

    @property
    def reruns(self) -> pd.DataFrame:
        return self.trials[~self.trials["role"].isin([SEARCH, WARM_START])]

    @property
    def warm(self) -> pd.DataFrame:
        """Trials taken from an earlier sweep (``--warm-start``): never run here."""
        return self.trials[self.trials["role"] == WARM_START]


def _csv(path: Path) -> pd.DataFrame:
    """A CSV file sweeps wrote, its header as the names it was given (:func:`cell_text`)."""
    try:  # trial ids are text: Ray's hex ids are sometimes all digits, even with a leading 0
        frame = pd.read_csv(path, dtype={"trial_id": str})
    except (FileNotFoundError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return pd.DataFrame()
    return frame.rename(columns=cell_text)


def _knobs(trials: pd.DataFrame, space: dict[str, Any], resolved: bool) -> list[str]:
    """Knob columns: the resolved search space's, else those the spec names and the columns
    between the trial's bookkeeping and the first objective."""
    if resolved:
        return [c for c in trials.columns if c in space]
    cols = [c for c in trials.columns if c not in META]
    first = next((i for i, c in enumerate(cols) if c.startswith(OBJECTIVE_PREFIX)), 0)
    return [c for c in cols if c in space or cols.index(c) < first]


def _space_kinds(spec: dict[str, Any], folder: Path
                 ) -> tuple[dict[str, str], bool, dict[str, dict[str, Any]]]:
    """knob -> "log" | "linear" | "categorical" | "fixed", whether ``extends`` and
    search-space files could be resolved (else only what sweep.yaml itself names), and
    each knob's entry (type, choices, low, high)."""
    raw, resolved = spec.get("search_space"), False
    kinds = {}
    try:  # resolves ``extends`` like the sweep did; the files may have moved since
        from sweeps.spec.loader import load_sweep_dict

        data = {k: v for k, v in spec.items() if k != "source"}
        base = Path(str(spec.get("source") or folder / "sweep.yaml")).parent
        space = load_sweep_dict(data, base_dir=base, workdir=base, import_trainer=False).space
        raw, resolved = {k: knob.model_dump() for k, knob in space.items()}, True
    except Exception:  # fall back to what sweep.yaml itself says
        pass
    entries = {k: v for k, v in (raw if isinstance(raw, dict) else {}).items()
               if isinstance(v, dict) and "type" in v}
    for knob, entry in entries.items():
        kind = entry["type"]
        kinds[knob] = ("log" if kind == "loguniform" or entry.get("log") else
                       kind if kind in ("categorical", "fixed") else "linear")
    return kinds, resolved, entries


def _kind(values: pd.Series, declared: str | None) -> str:
    """How a knob's values are laid out on a plot axis (declared, else guessed)."""
    if declared in ("log", "linear", "categorical"):
        return declared
    if values.dtype == bool or not pd.api.types.is_numeric_dtype(values):
        return "categorical"
    distinct = values.dropna().nunique()
    return "categorical" if distinct <= 5 and len(values) > 2 * distinct else "auto"


def load(folder: Path, name: str | None = None, objectives: list[str] | None = None) -> Results:
    """Read trials.csv, pareto.csv, sweep.yaml and stable/ (any of them may be missing)."""
    folder = Path(folder)
    try:
        spec = yaml.safe_load((folder / "sweep.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        spec = {}
    spec = spec if isinstance(spec, dict) else {}
    declared, resolved, entries = _space_kinds(spec, folder)
    objs = [o for o in spec.get("objectives") or [] if isinstance(o, dict) and "metric" in o]
    modes = {str(o["metric"]): str(o.get("mode", "min")) for o in objs}
    trials = _csv(folder / "trials.csv")
    for col in META:
        if col not in trials:
            trials[col] = pd.Series(dtype=object)
    trials["reason"] = trials["reason"].fillna("").astype(str)
    trials["diagnosis"] = trials["diagnosis"].fillna("").astype(str) \
        if "diagnosis" in trials else ""
    trials["status"] = trials["status"].fillna("").astype(str)
    trials["role"] = trials["role"].fillna(SEARCH).astype(str)
    trials["trial_id"] = trials["trial_id"].astype(str)
    if objectives is None:  # step_time may have been added by the loader: see the columns
        objectives = list(modes) + [c.removeprefix(OBJECTIVE_PREFIX) for c in trials
                                    if c.startswith(OBJECTIVE_PREFIX)
                                    and c.removeprefix(OBJECTIVE_PREFIX) not in modes]
    pareto = _csv(folder / "pareto.csv")
    if len(pareto):
        pareto["trial_id"] = pareto["trial_id"].astype(str)
        conf = pareto["confirmed"] if "confirmed" in pareto else pd.Series(True, pareto.index)
        pareto["confirmed"] = conf.astype(str).str.lower().isin(["true", "1", "1.0"])
        if "front_rank" not in pareto:
            pareto["front_rank"] = range(1, len(pareto) + 1)
        pareto = pareto.sort_values("front_rank")
    knobs = _knobs(trials, declared, resolved)
    kinds = {k: _kind(trials[k], declared.get(k)) for k in knobs}
    stable = sorted(f"stable/{p.name}" for p in (folder / "stable").glob("*.yaml"))
    seed = spec.get("seed", 0)
    rules = spec.get("rules") if isinstance(spec.get("rules"), dict) else {}
    baseline = rules.get("baseline_loss")
    return Results(folder, name or str(spec.get("name") or folder.name), trials, pareto,
                   list(objectives), modes, knobs, kinds, stable,
                   seed if isinstance(seed, int) else 0,
                   float(baseline) if isinstance(baseline, (int, float)) else None,
                   {k: v for k, v in entries.items() if k in knobs}, _notes(folder))


#: Why confirmation stopped before ``confirm.keep`` configs held (one line each).


def _notes(folder: Path) -> list[str]:
    path = folder / SELECTION_NOTES
    if not path.is_file() or path.is_symlink():
        return []
    return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][:20]


def _plain(v: Any) -> Any:
    """A JSON-safe Python value: NaN -> None, ±inf -> "inf"/"-inf", numpy -> builtin."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if v is pd.NA or v is None:
        return None
    if isinstance(v, float):
        return None if math.isnan(v) else (("inf" if v > 0 else "-inf") if math.isinf(v) else v)
    return v


def _knob_stats(values: pd.Series, categorical: bool) -> dict[str, Any]:
    present = values.dropna()
    if not len(present):
        return {}
    if categorical or not pd.api.types.is_numeric_dtype(present):
        counts = present.value_counts()
        return {"most_common": _plain(counts.index[0]), "count": int(counts.iloc[0]),
                "of": int(len(present))}
    return {"median": _plain(present.median()), "min": _plain(present.min()),
            "max": _plain(present.max())}


def _labels(trials: pd.DataFrame) -> pd.Series:
    """A trial's failure label: its reason, or ``pruned · <rule>`` for a pruned trial the
    rules diagnosed (the rule is the diagnosis's first word), else ""."""
    diagnosed = (trials["status"] == PRUNED) & (trials["diagnosis"] != "")
    rule = trials["diagnosis"].str.split(" ").str[0]
    return trials["reason"].where(~diagnosed, PRUNED_LABEL_PREFIX + rule)


def taxonomy(res: Results) -> list[dict[str, Any]]:
    """Failure reasons among search trials, most common first, with the settings behind
    them; pruned trials the rules diagnosed come after, as ``pruned · <rule>``."""
    search = res.search.assign(label=_labels(res.search))
    failed = search[search["label"] != ""]
    rerun = res.reruns[res.reruns["reason"] != ""]["reason"].value_counts()
    out = []
    counts = failed["label"].value_counts()
    order = [k for k in counts.index if not k.startswith(PRUNED)] + \
        [k for k in counts.index if k.startswith(PRUNED)]
    for reason in order:
        part = failed[failed["label"] == reason]
        stop = pd.to_numeric(part["stop_step"], errors="coerce")
        if stop.isna().all():  # pruned: the step its history ends at
            stop = pd.to_numeric(part["steps"], errors="coerce")
        out.append({"reason": reason, "trials": int(counts[reason]),
                    "in_reruns": int(rerun.get(reason, 0)),
                    "status": part["status"].mode().iloc[0],
                    "stop_step": _knob_stats(stop, False),
                    "knobs": {k: _knob_stats(part[k], k in res.categorical) for k in res.knobs}})
    for reason, count in rerun.items():
        if reason not in set(failed["label"]):
            out.append({"reason": reason, "trials": 0, "in_reruns": int(count),
                        "status": "", "stop_step": {}, "knobs": {}})
    return out


def summary(folder: Path) -> dict[str, Any]:
    """The report's content as plain data: counts, failure taxonomy, front, stable YAMLs."""
    return summary_of(load(folder))


def summary_of(res: Results) -> dict[str, Any]:
    """``summary`` of an already loaded folder."""
    front = [{k: _plain(v) for k, v in row.items()}
             for row in res.pareto.to_dict(orient="records")]
    tax = taxonomy(res)
    return {
        "name": res.name,
        "folder": str(res.folder),
        "objectives": [{"metric": o, "mode": res.modes.get(o, "min")} for o in res.objectives],
        "knobs": res.knobs,
        "search_trials": int(len(res.search)),
        "counts": {k: int(v) for k, v in res.search["status"].value_counts().items()},
        "rerun_counts": {k: int(v) for k, v in res.reruns["status"].value_counts().items()},
        "warm_start": _warm_summary(res),
        "selection_notes": list(res.notes),
        "failures": {t["reason"]: t["trials"] for t in tax
                     if t["trials"] and not t["reason"].startswith(PRUNED)},
        "diagnoses": {t["reason"].removeprefix(PRUNED_LABEL_PREFIX): t["trials"] for t in tax
                      if t["reason"].startswith(PRUNED)},
        "taxonomy": tax,
        "front": front,
        "selection": {k: int(v) for k, v in res.pareto.get(
            SELECTION, pd.Series(dtype=str)).value_counts().items()},
        "fragile": {str(r["trial_id"]): str(r.get(SELECTION_REASON) or "")
                    for r in res.pareto.to_dict(orient="records")
                    if r.get(SELECTION) in ("fragile", "incomplete", "poor")},
        "base": _base_summary(res),
        "compile_fallbacks": compile_fallbacks(res.trials),
        "importance": importance(res.folder, res.name, res.objectives, res.search, res.space),
        "stable_yamls": res.stable,
        "best_yaml": str(res.folder / res.stable[0]) if res.stable else None,
        "worse_than_base": worse_than_base(res.folder / res.stable[0]) if res.stable else None,
    }


def _warm_summary(res: Results) -> dict[str, Any] | None:
    """How many trials of which earlier sweeps seeded the search (``--warm-start``)."""
    warm = res.warm
    if not len(warm):
        return None
    source = warm["warm_start_from"] if "warm_start_from" in warm else pd.Series(dtype=str)
    return {"trials": int(len(warm)),
            "counts": {k: int(v) for k, v in warm["status"].value_counts().items()},
            "from": sorted({str(v) for v in source.dropna()})}


def _seed_values(frame: pd.DataFrame, metric: str) -> dict[int, str]:
    """Columns ``<metric>@seed<s>`` of pareto.csv, by seed."""
    prefix = seed_column_prefix(metric)
    return {int(c[len(prefix):]): c for c in frame.columns
            if c.startswith(prefix) and c[len(prefix):].isdigit()}


def _base_summary(res: Results) -> dict[str, Any] | None:
    """The base config's reference runs: quality by seed and the fresh-seed mean."""
    if not res.objectives:
        return None
    col = objective_column(res.objectives[0])
    runs = res.trials[res.trials["role"] == "base"]
    if not len(runs) and BASE_CONFIG in res.trials:  # the base config was a search trial
        marked = res.trials[res.trials[BASE_CONFIG].astype(str) == "True"]
        if len(marked):
            trial_id = str(marked.iloc[0]["trial_id"])
            runs = res.trials[(res.trials["trial_id"] == trial_id)
                              | (res.trials["role"] == confirm_role(trial_id))]
    if not len(runs) or col not in runs:
        return None
    by_seed = {int(r["seed"]): _plain(r[col]) if r["status"] == OK else r["status"]
               for r in runs.to_dict(orient="records")}
    fresh = [v for s, v in by_seed.items() if s != res.seed and isinstance(v, (int, float))]
    return {"by_seed": by_seed, "mean": sum(fresh) / len(fresh) if fresh else None}


# ---------------------------------------------------------------- plots


def _history(res: Results, trial_id: str) -> pd.DataFrame | None:
    if not _SAFE_ID.fullmatch(trial_id):
        return None
    hist = _csv(res.folder / "trials" / f"{trial_id}.csv")
    return hist if len(hist) else None


def _failed_curves(res: Results) -> list[plots.Curve]:
    failed = res.trials[((res.trials["reason"] != "") | res.trials["status"].isin(FAILED))
                        & (res.trials["role"] != WARM_START)]
    failed = pd.concat([failed[failed["role"] == SEARCH], failed[failed["role"] != SEARCH]])
    queues = [list(g.itertuples()) for _, g in failed.groupby("reason", sort=False)]
    curves: list[plots.Curve] = []
    while any(queues) and len(curves) < MAX_FAILED_CURVES:  # round-robin over reasons
        for queue in queues:
            if queue and len(curves) < MAX_FAILED_CURVES:
                row = queue.pop(0)
                hist = _history(res, row.trial_id)
                if hist is None:
                    continue
                stop = pd.to_numeric(pd.Series([row.stop_step]), errors="coerce").iloc[0]
                role = "" if row.role == SEARCH else f" [{row.role.split(':')[0]}]"
                at = f" @ {int(stop)}" if pd.notna(stop) else ""
                curves.append(plots.Curve(f"{row.trial_id} {row.reason or row.status}{at}"
                                          f"{role}", hist, None if pd.isna(stop) else stop))
    return curves


def _top_curves(res: Results) -> list[plots.Curve]:
    curves = []
    for row in res.pareto.head(MAX_TOP_CURVES).itertuples():
        hist = _history(res, row.trial_id)
        if hist is not None:
            tag = "confirmed" if row.confirmed else "not confirmed"
            curves.append(plots.Curve(f"#{row.front_rank} {row.trial_id} ({tag})", hist))
    return curves


def _seed_plot(res: Results, path: Path) -> Path | None:
    if not res.objectives or not len(res.pareto):
        return None
    metric = res.objectives[0]
    cols = _seed_values(res.pareto, metric)
    if not cols:
        return None
    rows = []
    for rec in res.pareto.to_dict(orient="records"):
        values = {s: pd.to_numeric(rec.get(c), errors="coerce") for s, c in cols.items()}
        search = values.pop(res.seed, float("nan"))
        rows.append(plots.SeedRow(str(rec["trial_id"]), str(rec.get(SELECTION) or ""),
                                  None if pd.isna(search) else float(search),
                                  [float(v) for v in values.values() if pd.notna(v)]))
    base = _base_summary(res)
    if base:
        nums = {s: v for s, v in base["by_seed"].items() if isinstance(v, (int, float))}
        rows.append(plots.SeedRow("base", "base config", nums.pop(res.seed, None),
                                  list(nums.values())))
    return plots.seed_plot(rows, metric, res.modes.get(metric, "min"), path)


def _default_pair(res: Results) -> tuple[str, str | None] | None:
    numeric = [k for k in res.knobs if pd.to_numeric(res.trials[k], errors="coerce").notna().any()]
    varying = [k for k in numeric if res.trials[k].nunique() > 1] + \
              [k for k in numeric if res.trials[k].nunique() <= 1]
    x = "lr" if "lr" in numeric else next((k for k in varying if k != "grad_clip"), None)
    rest = [k for k in varying if k != x]
    y = "grad_clip" if "grad_clip" in rest and res.trials["grad_clip"].nunique() > 1 else \
        next(iter(rest), None)
    if x is None:
        x, y = y, None
    return None if x is None else (x, y)


def _slug(*parts: str | None) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p or "outcome") for p in parts)


def draw(res: Results, pairs: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Write every plot; returns {section: [(file name, caption)], "notes": [...]}."""
    folder, out, notes = res.folder, {}, []
    front = set(res.pareto.get("trial_id", []))
    path = plots.pareto_plot(res.search, res.pareto, res.objectives, res.modes,
                             folder / "pareto.png")
    out["pareto"] = [(path.name, "Pareto front")] if path else []
    path = _seed_plot(res, folder / "seeds.png")
    out["seeds"] = [(path.name, "Quality on every seed")] if path else []
    maps = [p for p in [_default_pair(res)] if p] + list(pairs or [])
    out["map"] = []
    for x, y in dict.fromkeys(maps):
        missing = [k for k in (x, y) if k is not None and k not in res.trials]
        if missing:
            notes.append(f"stability map {x} × {y}: no column {', '.join(missing)}")
            continue
        path = plots.stability_map(res.search, x, y, res.kinds, front,
                                   folder / f"stability-{_slug(x, y)}.png")
        if path:
            out["map"].append((path.name, f"{x} × {y or 'outcome'}"))
    out["curves"] = []
    for key, curves, title in (
            ("failed", _failed_curves(res), "Failed trials (dotted line: stop step)"),
            ("top", _top_curves(res), "Pareto-front configs")):
        path = plots.curves_plot(curves, title, folder / f"curves-{key}.png", res.baseline)
        if path:
            out["curves"].append((path.name, title))
    out["notes"] = notes
    made = {name for section in ("pareto", "seeds", "map", "curves")
            for name, _ in out[section]}
    for pattern in _PLOT_GLOBS:  # plots of an earlier report that this one did not draw
        for stale in folder.glob(pattern):
            if stale.name not in made:
                stale.unlink(missing_ok=True)
    return out


# ---------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
nav a{margin-right:1em}.muted{color:#777}.note{color:#a33}
.badge{display:inline-block;padding:1px 8px;margin:2px;border-radius:9px;color:#fff;
font-size:13px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0;display:block}
.scroll{overflow:auto;max-height:70vh;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;white-space:nowrap;text-align:right}
td.t,th{text-align:left}th{background:#f3f3f3;position:sticky;top:0}
table.sortable th{cursor:pointer}th[data-dir=asc]::after{content:" \\25B2"}
th[data-dir=desc]::after{content:" \\25BC"}
tr.st-unstable td:first-child,tr.st-crash td:first-child{border-left:4px solid #e76f51}
tr.st-ok td:first-child{border-left:4px solid #2ca02c}
tr.st-pruned td:first-child{border-left:4px solid #c0c0c0}
table.importance td{min-width:9em;text-align:left}
.bar{display:inline-block;height:9px;background:#4c78a8;margin-right:6px;vertical-align:middle}
"""

JS = """
document.querySelectorAll('table.sortable th').forEach(th => th.addEventListener('click',
 () => {
  const i = th.cellIndex, body = th.closest('table').tBodies[0], asc = th.dataset.dir !== 'asc';
  th.parentNode.querySelectorAll('th').forEach(h => delete h.dataset.dir);
  th.dataset.dir = asc ? 'asc' : 'desc';
  const val = r => r.cells[i].dataset.v ?? r.cells[i].textContent.trim();
  const cmp = (a, b) => { const x = Number(a), y = Number(b);
    return isNaN(x) || isNaN(y) ? a.localeCompare(b) : x - y; };
  [...body.rows].sort((r, s) => { const a = val(r), b = val(s);
    return a === '' || b === '' ? (a === '') - (b === '') : (asc ? 1 : -1) * cmp(a, b); })
   .forEach(r => body.appendChild(r));
 }));
window.addEventListener('load', () => { const im = [...document.images];
  document.body.dataset.imagesLoaded =
    im.filter(x => x.complete && x.naturalWidth > 0).length + '/' + im.length; });
"""

e = html.escape


def _cell(v: Any) -> tuple[str, str]:
    """(display text, sort key) of one table value."""
    v = _plain(v)
    if v is None:
        return "", ""
    if isinstance(v, bool):
        return ("yes" if v else "no"), str(int(v))
    if isinstance(v, (int, float)):
        return (f"{v:.4g}" if isinstance(v, float) else str(v)), repr(v)
    if v in ("inf", "-inf"):
        return v, v.replace("inf", "Infinity")
    return str(v), str(v)


def _link(href: str, text: str) -> str:
    return f'<a href="{e(quote(href))}">{e(text)}</a>'


def table(frame: pd.DataFrame, folder: Path, sortable: bool = True) -> str:
    """An HTML table; trial ids link to their history, ``yaml`` to the stable file."""
    head = "".join(f"<th>{e(str(c))}</th>" for c in frame.columns)
    rows = []
    for rec in frame.to_dict(orient="records"):
        cells = []
        for col, raw in rec.items():
            text, key = _cell(raw)
            shown = e(text if len(text) <= 60 else text[:57] + "…")
            if col == "trial_id" and (folder / "trials" / f"{text}.csv").exists() \
                    and _SAFE_ID.fullmatch(text):
                shown = _link(f"trials/{text}.csv", text)
            elif col == "yaml" and text.startswith("stable/") and (folder / text).exists():
                shown = _link(text, text.removeprefix("stable/"))
            numeric = isinstance(_plain(raw), (int, float)) and not isinstance(raw, bool)
            title = f' title="{e(text)}"' if len(text) > 60 else ""
            cells.append(f'<td{"" if numeric else " class=t"} data-v="{e(key)}"{title}>'
                         f"{shown}</td>")
        status = e(str(rec.get("status", "")))
        rows.append(f'<tr class="st-{status}">' + "".join(cells) + "</tr>")
    cls = ' class="sortable"' if sortable else ""
    return (f'<div class="scroll"><table{cls}><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(rows) + "</tbody></table></div>")


def _badges(counts: dict[str, int], colours: dict[str, str]) -> str:
    return " ".join(f'<span class="badge" style="background:{colours.get(k, "#555")}">'
                    f"{e(k)} {n}</span>" for k, n in counts.items()) or "<span>none</span>"


def _stats_text(stats: dict[str, Any], knob: str = "") -> str:
    if not stats:
        return ""
    if "most_common" in stats:
        value = _cell(stats["most_common"])[0]
        value = "off" if knob == "grad_clip" and value == "0" else value
        return f"{value} ({stats['count']}/{stats['of']})"
    lo, mid, hi = (_cell(stats[k])[0] for k in ("min", "median", "max"))
    return mid if lo == hi else f"{mid} [{lo} – {hi}]"


def _header(res: Results, info: dict[str, Any]) -> str:
    objs = ", ".join(f"{o} ({res.modes.get(o, 'min')})" for o in res.objectives) or "none"
    stable = "".join(f"<li>{_link(p, p)}</li>" for p in res.stable)
    stable_html = (f"<ol>{stable}</ol>" if stable else
                   "<p class=note>No config passed confirmation: nothing in stable/.</p>")
    return (f"<h1>Sweep {e(res.name)}</h1><p class=muted>objectives: {e(objs)} · knobs: "
            f"{e(', '.join(res.knobs) or 'none')}</p>"
            f"<p><b>{info['search_trials']} search trials</b>: "
            f"{_badges(info['counts'], plots.STATUS_COLOURS)}</p>"
            f"<p>confirmation re-runs: {_badges(info['rerun_counts'], plots.STATUS_COLOURS)}"
            f"</p>{_warm_html(info)}<p>failures by reason: "
            f"{_badges(info['failures'], plots.OUTCOME_COLOURS)}</p>"
            f"<h3>Stable configs (best first)</h3>{stable_html}"
            + "".join(f"<p class=note>{e(n)}</p>" for n in res.notes) +
            f"{_warning_html(res)}{_compile_html(res)}"
            "<nav><a href='#pareto'>Pareto front</a><a href='#seeds'>Fresh seeds</a>"
            "<a href='#map'>Stability map</a><a href='#importance'>Knob importance</a>"
            "<a href='#curves'>Curves</a><a href='#taxonomy'>Failure taxonomy</a>"
            "<a href='#trials'>All trials</a></nav>")


def _warm_html(info: dict[str, Any]) -> str:
    """The line naming the earlier sweep whose trials seeded the search, else ''."""
    warm = info.get("warm_start")
    if not warm:
        return ""
    return (f"<p>warm start: <b>{warm['trials']} trials</b> of {e(', '.join(warm['from']))} "
            f"seeded the search ({_badges(warm['counts'], plots.STATUS_COLOURS)}); they were "
            "not run here and are no candidates (role <code>warm_start</code> in All trials)"
            "</p>")


def _fragile_html(res: Results) -> str:
    rows = [r for r in res.pareto.to_dict(orient="records")
            if r.get(SELECTION) in ("fragile", "incomplete", "poor")]
    if not rows:
        return ""
    items = "".join(f"<li><b>{e(str(r['trial_id']))}</b> ({e(str(r['selection']))}): "
                    f"{e(str(r.get(SELECTION_REASON) or ''))}</li>" for r in rows)
    return f"<p>Not handed over:</p><ul>{items}</ul>"


def _warning_html(res: Results) -> str:
    """The WARNING line of the top YAML's header (e.g. worse than the base config)."""
    if not res.stable:
        return ""
    try:
        head = (res.folder / res.stable[0]).read_text().splitlines()
    except OSError:
        return ""
    lines = [h[2:] for h in head if h.startswith("# WARNING") or "UNCONFIRMED" in h]
    return "".join(f"<p class=note><b>{e(line)}</b></p>" for line in lines)


def compile_fallbacks(trials: pd.DataFrame) -> dict[str, str]:
    """Trials labelled compiled that ran eagerly (trials.csv ``compile_fallback``): id -> why."""
    if "compile_fallback" not in trials:
        return {}
    rows = trials[trials["compile_fallback"].fillna("").astype(str) != ""]
    return {str(t): str(r) for t, r in zip(rows["trial_id"], rows["compile_fallback"],
                                           strict=True)}


def _compile_html(res: Results) -> str:
    """A warning naming the trials labelled compiled that ran eagerly, else ''."""
    found = compile_fallbacks(res.trials)
    if not found:
        return ""
    items = "".join(f"<li><b>{e(t)}</b>: {e(r)}</li>" for t, r in found.items())
    return (f"<p class=note><b>WARNING: {len(found)} trial(s) labelled compiled ran eagerly"
            "</b>; their step_time is not counted as the compile mode's speed (they are "
            f"left off the step-time Pareto front):</p><ul>{items}</ul>")


def _importance_html(imp: dict[str, Any]) -> str:
    """The knob-importance table (one column per target), notes and under-explored choices."""
    out = [f"<p class=muted>Evaluator: {e(imp['evaluator'])}, {e(imp['why'])}. Quality: "
           "which knobs set the best of the trials that finished ok apart from the others (the "
           "best 5, or the best 10 % when that is more). Stability: which knobs set the stable "
           "trials (ok or pruned) apart from the unstable ones (unstable, crashed, or pruned "
           "with a diagnosis). Shares of 100 % per column; a knob that never varied is left "
           "out.</p>"]
    targets = imp["targets"]
    if imp["note"]:
        out.append(f"<p class=note>No importance panel: {e(imp['note'])}.</p>")
    heads = {"quality": f"quality ({targets.get('quality', {}).get('metric', '')})",
             "stability": "stability"}
    ranked = {k: t["importances"] for k, t in targets.items() if t["importances"]}
    knobs = list(dict.fromkeys(k for found in ranked.values() for k in found))
    if knobs:
        rows = "".join(
            f"<tr><td class=t>{e(k)}</td>" + "".join(
                f"<td>{_share(ranked[t].get(k))}</td>" for t in ranked) + "</tr>"
            for k in knobs)
        cols = "".join(f"<th>{e(heads[t])}</th>" for t in ranked)
        out.append(f"<table class=importance><thead><tr><th>knob</th>{cols}</tr></thead>"
                   f"<tbody>{rows}</tbody></table>")
    lines = []
    for key, target in targets.items():
        counted = f"{target['trials']} trials" + (
            f": {target['stable']} stable, {target['unstable']} unstable"
            if key == "stability" else " finished ok")
        note = f" — {target['note']}" if target["note"] else ""
        lines.append(f"{e(heads[key])}: {e(counted)}{e(note)}")
    if lines:
        out.append(f"<p class=muted>{'<br>'.join(lines)}</p>")
    if imp["under_explored"]:
        items = "".join(f"<li>{e(u['text'])}</li>" for u in imp["under_explored"])
        out.append(f"<p class=note><b>Barely explored</b>:</p><ul>{items}</ul>")
    return "".join(out)


def _share(value: float | None) -> str:
    """An importance share as a percentage with a bar behind it."""
    if value is None:
        return ""
    pct = 100 * value
    return (f'<span class=bar style="width:{pct:.0f}px"></span>{pct:.0f} %')


def _images(items: list[tuple[str, str]], empty: str) -> str:
    return "".join(f'<img src="{e(quote(f))}" alt="{e(c)}">' for f, c in items) or \
        f"<p class=muted>{e(empty)}</p>"


def _taxonomy_html(res: Results, folder: Path) -> str:
    rows = [{"reason": t["reason"], "search trials": t["trials"], "in re-runs": t["in_reruns"],
             "status": t["status"], "stop step": _stats_text(t["stop_step"]),
             **{k: _stats_text(v, k) for k, v in t["knobs"].items()}} for t in taxonomy(res)]
    if not rows:
        return "<p>No trial failed.</p>"
    return ("<p class=muted>Per knob: median [range] among the trials stopped for that "
            "reason; categorical knobs: most common value (trials).</p>"
            + table(pd.DataFrame(rows), folder))


def _audit_html(res: Results, folder: Path) -> str:
    """A "Rule audit" section when ``sweeps audit`` left audit.csv here, else ''."""
    from sweeps.results.audit import per_rule, stopped_trials

    rows = _csv(folder / "audit.csv")
    if not {"reason", "outcome"} <= set(rows.columns) or not len(rows):
        return ""
    rows["reason"] = rows["reason"].astype(str)
    stopped = stopped_trials(res.trials, pruned=True)
    rules = per_rule(rows, stopped)
    for col in ("precision", "failed_share"):
        rules[col] = [f"{100 * v:.0f} %" for v in rules[col]]
    return ("<h2 id=audit>Rule audit</h2><p class=muted>Stopped trials re-run to full length "
            "with the rules only watching (<code>sweeps audit</code>): recovered = within "
            "the margin of the best ok trial, failed = non-finite, crashed, at the baseline or "
            "worse than its start; precision = 1 − recovered / audited. Details: "
            f"{_link('audit.md', 'audit.md')}.</p>" + table(rules, folder, sortable=False))


def write_report(folder: Path, name: str, objectives: list[str],
                 pairs: list[tuple[str, str]] | None = None) -> Path:
    """Write ``folder/report.html`` and its plots; ``pairs``: extra stability-map knob pairs."""
    folder = Path(folder)
    res = load(folder, name, objectives)
    info = summary_of(res)
    figs = draw(res, pairs)
    pareto_cols = list(dict.fromkeys(
        [c for c in ("front_rank", "trial_id", "yaml", "confirmed") if c in res.pareto]
        + list(res.pareto.columns)))
    parts = [
        _header(res, info),
        "<h2 id=pareto>Pareto front</h2>",
        "<p class=muted>Search trials by status; ringed: the candidates judged on fresh "
        "seeds (the noise-aware Pareto front first; black: confirmed, red: fragile or not "
        "confirmed); numbers: their row in pareto.csv.</p>",
        _images(figs["pareto"], "No search trial has values for two objectives to plot."),
        table(res.pareto[pareto_cols], folder) if len(res.pareto)
        else "<p>No Pareto front: no search trial finished ok.</p>",
        "<h2 id=seeds>Candidates on fresh seeds</h2>",
        "<p class=muted>Each candidate re-run on fresh seeds: hollow dot = the seed it was "
        "found on, filled dots = fresh seeds, bar = fresh-seed mean (the rank order). "
        "Fragile: unstable on a seed or at the LR probe, or its worst seed beyond the "
        "tolerance from its best.</p>",
        _images(figs["seeds"], "No candidate was re-run on fresh seeds."),
        _fragile_html(res),
        "<h2 id=map>Stability map</h2>",
        _images(figs["map"], "No numeric knob to map."),
        "".join(f"<p class=note>{e(n)}</p>" for n in figs["notes"]),
        "<h2 id=importance>Knob importance</h2>",
        _importance_html(info["importance"]),
        "<h2 id=curves>Curves</h2>",
        f"<p class=muted>Up to {MAX_FAILED_CURVES} failed trials (one per reason first) and "
        f"the top {MAX_TOP_CURVES} front configs, from trials/&lt;id&gt;.csv.</p>",
        _images(figs["curves"], "No metric histories (trials/) for failed or front trials."),
        "<h2 id=taxonomy>Failure taxonomy</h2>",
        _taxonomy_html(res, folder),
        _audit_html(res, folder),
        "<h2 id=trials>All trials</h2><p class=muted>Click a column header to sort.</p>",
        table(res.trials, folder) if len(res.trials) else "<p>No trials.</p>",
    ]
    page = ("<!doctype html><html lang=en><head><meta charset='utf-8'>"
            f"<title>Sweep {e(res.name)}</title><style>{CSS}</style></head><body>"
            + "\n".join(parts) + f"<script>{JS}</script></body></html>")
    out = folder / "report.html"
    write_text(out, page)
    return out
