"""The package's own tree: nothing in it is git-ignored or hidden from ruff, every folder
of it is a package. (The results root ``results/`` is ignored; ``sweeps/results/`` is code.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sweeps"


def _git_checkout() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists()


def _package_dirs() -> list[Path]:
    return [d for d in PACKAGE.rglob("*") if d.is_dir() and d.name != "__pycache__"
            and any(d.glob("*.py"))]


@pytest.mark.skipif(not _git_checkout(), reason="not a git checkout")
def test_no_path_of_the_package_is_git_ignored_but_the_results_root_is() -> None:
    probes = [str((d / "_new_module.py").relative_to(ROOT)) for d in _package_dirs()]
    probes.append("results/some-sweep/trials.csv")
    out = subprocess.run(["git", "check-ignore", "--no-index", *probes], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    assert out == ["results/some-sweep/trials.csv"]


def test_ruff_checks_every_module_of_the_package() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed beside this Python")
    shown = subprocess.run([str(ruff), "check", "--show-files", "."], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    checked = {Path(line.strip()).resolve() for line in shown.splitlines() if line.strip()}
    modules = {p.resolve() for p in PACKAGE.rglob("*.py")}
    assert modules - checked == set()


def test_every_folder_of_the_package_is_a_package() -> None:
    assert [d for d in _package_dirs() if not (d / "__init__.py").is_file()] == []


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, at any level (functions too), leaving out
    ``if TYPE_CHECKING:`` blocks; ``from pkg import mod`` counts as ``pkg.mod``."""
    import ast

    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs or {node.module}
    return out & modules


def test_no_import_circle_in_the_package() -> None:
    """No module reaches itself through imports (lazy imports inside functions count: a
    circle through one still ties the modules together)."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / "sweeps").rglob("*.py")}
    graph = {name: _imports(path, set(files)) - {name} for name, path in files.items()}
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert not circles, circles[:3]


PACKAGES = ["spec", "trial", "record", "tune", "results", "state", "commands", "rules",
            "preflight", "cluster", "integrations"]


def test_every_package_has_a_public_surface_that_resolves() -> None:
    import importlib

    for name in PACKAGES:
        package = importlib.import_module(f"sweeps.{name}")
        assert package.__all__, name
        if name == "integrations":  # its modules import Lightning / transformers
            continue
        for public in package.__all__:
            assert getattr(package, public) is not None, (name, public)


def _private_uses(path: Path, modules: set[str]) -> list[str]:
    """``from sweeps.x import _name`` and ``mod._name`` on a sweeps module in a test."""
    import ast

    tree = ast.parse(path.read_text())
    bound: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sweeps"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name}")
                if f"{node.module}.{alias.name}" in modules:
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            bound |= {a.asname for a in node.names if a.asname and a.name in modules}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in bound and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_tests_go_through_public_names() -> None:
    """A test that reaches into a module's private names pins its insides: tests use the
    public names (a behaviour worth testing has one)."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for p in (ROOT / "sweeps").rglob("*.py")}
    found = {str(p.relative_to(ROOT)): uses for p in sorted((ROOT / "tests").rglob("*.py"))
             if (uses := _private_uses(p, modules))}
    assert not found, found


def test_no_public_name_hides_a_module_of_its_package() -> None:
    """``from sweeps.state import seal`` must keep giving the module, not a function."""
    import importlib

    for name in PACKAGES:
        package = importlib.import_module(f"sweeps.{name}")
        modules = {p.stem for p in (ROOT / "sweeps" / name).glob("*.py")}
        if name != "integrations":
            assert not set(package.__all__) & modules, name
