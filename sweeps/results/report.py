"""The sweep report: a self-contained report.html with its PNG plots beside it, from a
folder read once (:mod:`sweeps.results.folder_data`), its summary
(:mod:`sweeps.results.summary`) and figures (:mod:`sweeps.results.figures`)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from sweeps.protocol import BASE_NOT_COMPARED, SELECTION, SELECTION_REASON
from sweeps.results import plots
from sweeps.results.export import header_lines
from sweeps.results.figures import draw
from sweeps.results.folder_data import (
    MAX_FAILED_CURVES,
    MAX_TOP_CURVES,
    SAFE_ID,
    Results,
    load,
    plain_value,
    read_csv,
    taxonomy,
)
from sweeps.results.summary import base_trial_id, compile_fallbacks, summary_of
from sweeps.state.atomic import write_text

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
    v = plain_value(v)
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
                    and SAFE_ID.fullmatch(text):
                shown = _link(f"trials/{text}.csv", text)
            elif col == "yaml" and text.startswith("stable/") and (folder / text).exists():
                shown = _link(text, text.removeprefix("stable/"))
            numeric = isinstance(plain_value(raw), (int, float)) and not isinstance(raw, bool)
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
            f"</p>{_warm_html(info)}{_probe_html(info)}<p>failures by reason: "
            f"{_badges(info['failures'], plots.OUTCOME_COLOURS)}</p>"
            + (f"<p>cut by ASHA, with what the rules saw in them: "
               f"{_badges(info['diagnoses'], plots.OUTCOME_COLOURS)}</p>"
               if info.get("diagnoses") else "") +
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


def _probe_html(info: dict[str, Any]) -> str:
    """The line saying lr's range came from the boundary probe (``high: probe``), else ''."""
    probe = info.get("lr_probe")
    if not probe:
        return ""
    report = probe.get("report") or ""
    text = e(probe["text"])
    return f"<p>{text.replace(e(report), _link(report, report)) if report else text}</p>"


def _fragile_html(res: Results) -> str:
    rows = [r for r in res.pareto.to_dict(orient="records")
            if r.get(SELECTION) in ("fragile", "incomplete", "poor")]
    if not rows:
        return ""
    base = base_trial_id(res)
    items = "".join(f"<li><b>{e(str(r['trial_id']))}</b>"
                    f"{' (your base config)' if str(r['trial_id']) == base else ''} "
                    f"({e(str(r['selection']))}): "
                    f"{e(str(r.get(SELECTION_REASON) or ''))}</li>" for r in rows)
    return f"<p>Not handed over:</p><ul>{items}</ul>"


def _warning_html(res: Results) -> str:
    """The WARNING line of the top YAML's header (e.g. worse than the base config), and
    its line saying it is your base config."""
    if not res.stable:
        return ""
    try:
        head = header_lines(res.folder / res.stable[0])  # of a JSON one: its .header
    except OSError:
        return ""
    lines = [h for h in head if h.startswith(("WARNING", "your base config:"))
             or "UNCONFIRMED" in h or BASE_NOT_COMPARED in h]
    return "".join(f"<p class=note><b>{e(line)}</b></p>" for line in lines)


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
            + (f" ({target['fragile']} of them fragile on a fresh seed, as the race judged "
               "them when it told the sampler)" if target.get("fragile") else "")
            if key == "stability" else " finished ok and held where raced (one found "
            "fragile on a fresh seed is counted with the failures)")
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
    from sweeps.results.audit import per_rule, percent, stopped_trials

    rows = read_csv(folder / "audit.csv")
    if not {"reason", "outcome"} <= set(rows.columns) or not len(rows):
        return ""
    rows["reason"] = rows["reason"].astype(str)
    stopped = stopped_trials(res.trials, pruned=True)
    rules = per_rule(rows, stopped)
    for col in ("precision", "failed_share"):
        rules[col] = [percent(v) for v in rules[col]]
    return ("<h2 id=audit>Rule audit</h2><p class=muted>Stopped trials re-run to full length "
            "with the rules only watching (<code>sweeps audit</code>): recovered = within "
            "the margin of the best ok trial, failed = non-finite, crashed, at the baseline or "
            "worse than its start; precision = 1 − recovered / audited; state_held = "
            "re-runs whose collapsed outputs or random-guess loss lasted through half the "
            "rest of the run. Details: "
            f"{_link('audit.md', 'audit.md')}.</p>" + table(rules, folder, sortable=False))


def write_report(folder: Path, name: str | None = None, objectives: list[str] | None = None,
                 pairs: list[tuple[str, str]] | None = None, *,
                 loaded: Results | None = None, info: dict[str, Any] | None = None) -> Path:
    """Write ``folder/report.html`` and its plots; ``pairs``: extra stability-map knob pairs.
    ``loaded`` and ``info``: the folder already read and summarised (``sweeps report``
    reads it once), else read here."""
    folder = Path(folder)
    res = loaded if loaded is not None else load(folder, name, objectives)
    info = info if info is not None else summary_of(res)
    figs = draw(res, pairs)
    pareto_cols = list(dict.fromkeys(
        [c for c in ("front_rank", "trial_id", "yaml", "confirmed") if c in res.pareto]
        + list(res.pareto.columns)))
    parts = [
        _header(res, info),
        "<h2 id=pareto>Pareto front</h2>",
        "<p class=muted>Search trials, coloured by status. Ringed: the candidates judged "
        "on fresh seeds (a black ring: confirmed; red: fragile or not confirmed). The "
        "number beside a ring is the candidate's row in pareto.csv, where the members of "
        "the noise-aware Pareto front come before the other candidates.</p>",
        _images(figs["pareto"], "No search trial has values for two objectives to plot."),
        table(res.pareto[pareto_cols].rename(columns={"front_rank": "row"}), folder)
        if len(res.pareto)
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
