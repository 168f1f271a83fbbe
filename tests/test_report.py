"""report.html and summary() on synthetic result folders, and the page as Chromium shows it."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.image import imread

from sweeps.protocol import objective_column
from sweeps.results import plots
from sweeps.results.report import write_report
from sweeps.results.summary import summary
from tests.conftest import skip_or_fail

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KNOBS = ("lr", "grad_clip", "dropout", "weight_decay", "warmup", "compile")
# trial id, status, reason, stop step, lr, grad_clip
SEARCH = [
    ("a1", "ok", "", None, 3e-3, 1.0), ("a2", "ok", "", None, 1e-3, 0.0),
    ("a3", "ok", "", None, 8e-3, 5.0), ("a4", "ok", "", None, 3e-4, 1.0),
    ("a5", "ok", "", None, 2e-2, 0.0), ("p1", "pruned", "", None, 1e-4, 5.0),
    ("p2", "pruned", "", None, 5e-5, 0.0), ("p3", "pruned", "", None, 0.3, 1.0),
    ("u1", "unstable", "non_finite", 12, 2.0, 0.0), ("u2", "unstable", "grad_blowup", 40, 0.5, 0.0),
    ("u3", "unstable", "grad_blowup", 25, 0.9, 5.0), ("u4", "unstable", "divergence", 60, 0.2, 0.0),
    ("u5", "unstable", "flat_at_baseline", 100, 1e-5, 1.0),
    ("u6", "unstable", "loss_spike", 33, 0.1, 0.0), ("c1", "crash", "oom", None, 1e-3, 1.0),
]
FRONT = [("a1", True), ("a3", True), ("a2", False)]  # (trial id, confirmed), best first


def _history(steps: int, lr: float, rng: np.random.Generator, *, reason: str = "",
             grad_norm: bool = True) -> pd.DataFrame:
    step = np.arange(1, steps + 1)
    loss = 1.5 * np.exp(-step / 60) + 0.1 + 0.03 * rng.random(steps)
    grad = 1.0 + 0.2 * rng.random(steps)
    if reason in ("grad_blowup", "divergence", "non_finite"):
        grad[-5:] *= 10.0 ** np.arange(1, 6)
        loss[-5:] *= 2.0 ** np.arange(1, 6)
    if reason == "non_finite":
        loss[-1], grad[-1] = np.nan, np.inf
    frame = pd.DataFrame({"step": step, "loss": loss, "lr": lr * np.minimum(1, step / 10),
                          "step_time": 0.02 + 0.001 * rng.random(steps)})
    if grad_norm:
        frame.insert(2, "grad_norm", grad)
    frame.loc[frame["step"] % 25 == 0, "val_loss"] = loss[step % 25 == 0] + 0.02
    return frame


def make_sweep(folder: Path, *, objectives: tuple[str, ...] = ("val_loss", "instability"),
               all_failed: bool = False, grad_norm: bool = True, histories: bool = True,
               nan: bool = False, compile_modes: bool = False) -> Path:
    """A results folder as a finished sweep leaves it (only the files the report reads)."""
    rng = np.random.default_rng(0)
    search = [(t, "unstable", "grad_blowup", 7, lr, clip) if all_failed else (t, s, r, st, lr, clip)
              for t, s, r, st, lr, clip in SEARCH]
    front = [] if all_failed else FRONT
    reruns = [] if all_failed else [
        ("r0", "confirm:a1", "ok", "", None, 3e-3, 1.0),
        ("r1", "probe:a1", "ok", "", None, 6e-3, 1.0),
        ("r2", "confirm:a3", "ok", "", None, 8e-3, 5.0),
        ("r3", "probe:a3", "unstable", "grad_blowup", 30, 1.6e-2, 5.0),
        ("r4", "confirm:a2", "unstable", "loss_spike", 20, 1e-3, 0.0)]
    rows = []
    for i, (tid, role, status, reason, stop, lr, clip) in enumerate(
            [(t, "search", s, r, st, lr, c) for t, s, r, st, lr, c in search] + reruns):
        steps = 0 if reason == "oom" else stop or (50 if status == "pruned" else 120)
        row = {"trial_id": tid, "role": role, "status": status, "reason": reason,
               "stop_step": stop, "seed": 0 if role == "search" else 1, "steps": steps,
               "retries": 0,
               "lr": lr, "grad_clip": clip, "dropout": 0.05 + 0.01 * i,
               "weight_decay": 10.0 ** -(1 + i % 5), "warmup": 10 * (i % 4),
               "compile": ["none", "default"][i % 2] if compile_modes else "none"}
        failed = status in ("unstable", "crash")
        values = {"val_loss": np.nan if reason == "oom" else 0.1 + 0.5 * rng.random() + failed,
                  "instability": np.nan if reason == "oom" else 2 * rng.random() + failed,
                  "step_time": 0.02 + 0.01 * rng.random()}
        row.update({objective_column(o): values[o] for o in objectives})
        row.update({"final_loss": values["val_loss"], "peak_grad_norm": 3.0 + 1e4 * failed,
                    "step_time": values["step_time"], "instability": values["instability"],
                    "evidence": json.dumps({"ratio": 148.4, "threshold": 50.0}) if failed else "",
                    "warnings": ""})
        rows.append(row)
        if histories and steps:
            folder.joinpath("trials").mkdir(parents=True, exist_ok=True)
            _history(steps, lr, rng, reason=reason,
                     grad_norm=grad_norm).to_csv(folder / "trials" / f"{tid}.csv", index=False)
    trials = pd.DataFrame(rows)
    if nan:
        trials.loc[[0, 3], objective_column("val_loss")] = np.nan
        trials.loc[1, "lr"] = np.nan
        trials.loc[2, objective_column(objectives[-1])] = np.inf
    folder.mkdir(parents=True, exist_ok=True)
    trials.to_csv(folder / "trials.csv", index=False)
    prows, rank = [], 0
    for i, (tid, confirmed) in enumerate(front, start=1):
        src = trials[trials["trial_id"] == tid].iloc[0]
        yml = ""
        if confirmed:
            rank += 1
            yml = f"stable/rank-{rank:02d}-{tid}.yaml"
            (folder / "stable").mkdir(exist_ok=True)
            (folder / yml).write_text(yaml.safe_dump({"training": {"lr": float(src["lr"])}}))
        prows.append({"front_rank": i, "trial_id": tid, **{k: src[k] for k in KNOBS},
                      **{o: src[objective_column(o)] for o in objectives},
                      "seeds_passed": int(confirmed), "seeds_run": 1,
                      "seed_failures": "" if confirmed else "loss_spike",
                      "lr_probe": "ok" if tid != "a3" else "unstable",
                      "lr_probe_reason": "grad_blowup" if tid == "a3" else "",
                      "lr_sensitivity": math.inf if tid == "a3" else 0.05,
                      "confirmed": confirmed, "yaml": yml})
    (folder / "pareto.csv").write_text(pd.DataFrame(prows).to_csv(index=False))
    spec = {"name": folder.name, "objectives": [{"metric": o, "mode": "min"} for o in objectives],
            "search_space": {"lr": {"type": "loguniform", "low": 1e-5, "high": 3.0},
                             "grad_clip": {"type": "categorical", "choices": [0, 1.0, 5.0]}},
            "write_back": {k: f"training.{k}" for k in KNOBS}}
    (folder / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def _images(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page)


def _check_images(folder: Path, page: str) -> list[str]:
    srcs = _images(page)
    for src in srcs:
        data = (folder / src).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, src
        assert imread(folder / src).shape[0] > 200
    return srcs


def _report(folder: Path, objectives: tuple[str, ...] = ("val_loss", "instability"),
            **kw) -> str:
    path = write_report(folder, folder.name, list(objectives), **kw)
    assert path == folder / "report.html"
    return path.read_text()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo sweep's folder and its report, rendered once for the tests that read it."""
    folder = make_sweep(tmp_path_factory.mktemp("report") / "demo")
    return folder, _report(folder)


def test_page_has_every_section_plot_and_link(demo: tuple[Path, str]) -> None:
    folder, page = demo
    for section in ('id=pareto', 'id=map', 'id=curves', 'id=taxonomy', 'id=trials'):
        assert section in page
    srcs = _check_images(folder, page)
    assert set(srcs) == {"pareto.png", "stability-lr-grad_clip.png", "curves-failed.png",
                         "curves-top.png"}
    assert page.count('href="stable/rank-01-a1.yaml"') >= 2  # header list and Pareto table
    assert 'href="stable/rank-02-a3.yaml"' in page
    assert 'href="trials/u2.csv"' in page
    assert "Sweep demo" in page and "ok 5" in page and "grad_blowup 2" in page
    assert "table.sortable" in page and 'class="sortable"' in page
    assert not re.search(r'(src|href)="(https?:)?//', page), "page must work offline"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")], "temp files left"


def test_taxonomy_table_names_the_settings_behind_each_reason(demo: tuple[Path, str]) -> None:
    page = demo[1]
    taxonomy = page[page.index("id=taxonomy"):page.index("id=trials")]
    for reason in ("grad_blowup", "non_finite", "divergence", "flat_at_baseline", "loss_spike",
                   "oom"):
        assert f">{reason}<" in taxonomy
    assert "0.7 [0.5 – 0.9]" in taxonomy  # lr of the two grad_blowup trials: median [range]


def test_summary_is_plain_json(tmp_path: Path) -> None:
    info = summary(make_sweep(tmp_path / "demo"))
    json.dumps(info, allow_nan=False)
    assert info["counts"] == {"ok": 5, "unstable": 6, "pruned": 3, "crash": 1}
    assert info["rerun_counts"] == {"ok": 3, "unstable": 2}
    assert info["failures"]["grad_blowup"] == 2 and info["failures"]["oom"] == 1
    blowup = next(t for t in info["taxonomy"] if t["reason"] == "grad_blowup")
    assert blowup["in_reruns"] == 1 and blowup["knobs"]["lr"]["median"] == pytest.approx(0.7)
    assert [r["trial_id"] for r in info["front"]] == ["a1", "a3", "a2"]
    assert [r["confirmed"] for r in info["front"]] == [True, True, False]
    assert info["front"][1]["lr_sensitivity"] == "inf"
    assert info["best_yaml"] == str(tmp_path / "demo" / "stable" / "rank-01-a1.yaml")
    assert info["knobs"] == list(KNOBS)
    assert info["objectives"][0] == {"metric": "val_loss", "mode": "min"}
    spec = yaml.safe_load((tmp_path / "demo" / "sweep.yaml").read_text())
    spec["objectives"][0]["baseline"] = 1.0  # a declared random guess is kept
    (tmp_path / "demo" / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert summary(tmp_path / "demo")["objectives"][0] == {"metric": "val_loss", "mode": "min",
                                                           "baseline": 1.0}


def test_sweeps_report_reads_and_summarises_the_folder_once(tmp_path: Path, monkeypatch,
                                                           capsys) -> None:
    """The report and the lines printed beside it come from one read of the folder (the
    importance panel, the slowest part, was computed twice)."""
    from sweeps.commands.cli import main
    from sweeps.results import folder_data
    from sweeps.results import summary as summary_module

    folder = make_sweep(tmp_path / "demo")
    calls = {"load": 0, "importance": 0}
    real_load, real_importance = folder_data.load, summary_module.importance

    def counting(name, real):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(folder_data, "load", counting("load", real_load))
    monkeypatch.setattr(summary_module, "importance", counting("importance", real_importance))
    assert main(["report", str(folder)]) == 0
    assert calls == {"load": 1, "importance": 1}
    assert "report: " in capsys.readouterr().out


def test_step_time_objective_adds_a_second_pareto_panel(tmp_path: Path) -> None:
    two = make_sweep(tmp_path / "two")
    three = make_sweep(tmp_path / "three", objectives=("val_loss", "instability", "step_time"),
                       compile_modes=True)
    _report(two)
    _report(three, ("val_loss", "instability", "step_time"))
    assert imread(three / "pareto.png").shape[1] > 1.8 * imread(two / "pareto.png").shape[1]


def test_categorical_grad_clip_zero_is_off() -> None:
    axis = plots.knob_axis(pd.Series([0.0, 5.0, 1.0, 0.0]), "categorical", zero_is_off=True)
    assert axis.labels == ["off", "1", "5"]
    assert axis.positions.tolist() == [0.0, 2.0, 1.0, 0.0]


def test_extra_pairs_and_unknown_knobs(tmp_path: Path) -> None:
    folder = make_sweep(tmp_path / "demo")
    page = _report(folder, pairs=[("dropout", "weight_decay"), ("lr", "nope")])
    assert "stability-dropout-weight_decay.png" in _check_images(folder, page)
    assert "no column nope" in page
    page = _report(folder)  # a later report without the pair drops its plot
    assert not (folder / "stability-dropout-weight_decay.png").exists()


def test_map_falls_back_to_the_first_numeric_knobs(tmp_path: Path) -> None:
    folder = make_sweep(tmp_path / "demo")
    trials = pd.read_csv(folder / "trials.csv").drop(columns=["lr", "grad_clip"])
    trials.to_csv(folder / "trials.csv", index=False)
    (folder / "sweep.yaml").unlink()
    assert "stability-dropout-weight_decay.png" in _check_images(folder, _report(folder))
    trials[["trial_id", "role", "status", "reason", "stop_step", "seed", "steps", "dropout",
            "objective_val_loss", "objective_instability"]].to_csv(folder / "trials.csv",
                                                                   index=False)
    assert "stability-dropout-outcome.png" in _check_images(folder, _report(folder))


@pytest.mark.parametrize("case", ["all_failed", "single_objective", "no_grad_norm",
                                  "no_histories", "nan", "empty", "nothing"])
def test_degenerate_folders_do_not_crash(tmp_path: Path, case: str) -> None:
    folder = tmp_path / case
    objectives: tuple[str, ...] = ("val_loss", "instability")
    if case == "single_objective":
        objectives = ("val_loss",)
    if case in ("empty", "nothing"):
        folder.mkdir()
        if case == "empty":
            (folder / "trials.csv").write_text("trial_id,role,status,reason\n")
            (folder / "pareto.csv").write_text("\n")
    else:
        make_sweep(folder, objectives=objectives, all_failed=case == "all_failed",
                   grad_norm=case != "no_grad_norm", histories=case != "no_histories",
                   nan=case == "nan")
    page = _report(folder, objectives)
    srcs = _check_images(folder, page)
    json.dumps(summary(folder), allow_nan=False)
    assert "id=trials" in page
    if case == "all_failed":
        assert "No Pareto front" in page and "nothing in stable/" in page
        assert "curves-failed.png" in srcs and "pareto.png" in srcs
    if case == "single_objective":
        assert "pareto.png" in srcs  # quality vs the (non-objective) instability column
    if case == "no_histories":
        assert not any(s.startswith("curves") for s in srcs)


# ---------------------------------------------------------------- in a browser

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,3000", "--virtual-time-budget=5000"]
# Appended to a copy of the page: sort the trials table by lr twice, as a click would.
CLICK = """<script>window.addEventListener('load', () => {
  const table = document.querySelector('#trials ~ div table');
  const col = [...table.tHead.rows[0].cells].findIndex(c => c.textContent === 'lr');
  const lrs = () => [...table.tBodies[0].rows].map(r => r.cells[col].dataset.v).join(',');
  table.tHead.rows[0].cells[col].click(); document.body.dataset.asc = lrs();
  table.tHead.rows[0].cells[col].click(); document.body.dataset.desc = lrs(); });</script>"""


def _chromium(tmp_path: Path, *args: str) -> str:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.mark.slow
def test_page_in_headless_chromium(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        skip_or_fail("chromium is not installed (apt-get install -y chromium)")
    folder = make_sweep(tmp_path / "demo")
    page = _report(folder)
    n = len(_images(page))
    dom = _chromium(tmp_path, "--dump-dom", (folder / "report.html").as_uri())
    assert f'data-images-loaded="{n}/{n}"' in dom, "an <img> has naturalWidth 0"
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", (folder / "report.html").as_uri())
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (3000, 1400)
    assert pixels.std() > 0.05 and (pixels.mean(axis=2) < 0.9).mean() > 0.02, "blank page"
    clicked = folder / "clicked.html"
    clicked.write_text(page.replace("</body>", CLICK + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", clicked.as_uri())
    asc = [float(v) for v in re.search(r'data-asc="([^"]*)"', dom).group(1).split(",")]
    desc = [float(v) for v in re.search(r'data-desc="([^"]*)"', dom).group(1).split(",")]
    assert asc == sorted(asc) and desc == sorted(desc, reverse=True) and len(asc) == 20


def test_a_failed_trial_with_no_quality_is_drawn_and_a_third_objective_gets_a_panel(
        monkeypatch) -> None:
    """val_loss, val_r2 and instability: the plot had one panel (no instability), and a
    failed trial whose val_r2 was NaN was left off it, so "failed (1)" showed one of two."""
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    search = pd.DataFrame({
        "trial_id": ["a", "b", "c", "u1", "u2"],
        "status": ["ok", "ok", "pruned", "unstable", "unstable"],
        "objective_val_loss": [0.014, 0.02, 0.05, 1.0, 1.0],
        "objective_val_r2": [0.985, 0.976, 0.95, 0.97, math.nan],
        "objective_instability": [0.3, 0.5, 0.4, 10.0, 10.0]})
    pareto = pd.DataFrame({"trial_id": ["a"], "front_rank": [1], "confirmed": [True]})
    objectives = ["val_loss", "val_r2", "instability"]
    modes = {"val_loss": "min", "val_r2": "max", "instability": "min"}
    assert plots.pareto_plot(search, pareto, objectives, modes, Path("p.png")) is not None
    axes = figures[0].axes
    assert [ax.get_ylabel() for ax in axes] == ["val_r2 (higher is better)",
                                                "instability (lower is better)"]
    for ax in axes:
        assert ax.get_title().endswith(": 5 search trials")
        labels = ax.get_legend_handles_labels()[1]
        assert "failed (2), on the top edge" in labels
