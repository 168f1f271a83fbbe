"""Finding the user's trainer from ``module:function``, as a user expects."""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sweeps.errors import SpecError, a_type

Trainer = Callable[[dict, Callable[[dict], None]], None]


def search_paths(sweep_dir: Path, workdir: Path) -> list[str]:
    """Folders a trainer module is imported from: the sweep file's folder, then the folder
    sweeps was started from."""
    paths = [str(sweep_dir.resolve()), str(workdir.resolve())]
    return list(dict.fromkeys(paths))


def add_search_paths(paths: Sequence[str]) -> None:
    """Put ``paths`` at the front of ``sys.path`` (once each) for good: only in the process
    a trial runs in, where the trainer may import its own modules at any time."""
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)


@contextmanager
def on_sys_path(paths: Sequence[str]) -> Iterator[None]:
    """``paths`` at the front of ``sys.path`` for the block; ``sys.path`` is restored after
    (modules imported meanwhile stay imported)."""
    saved = list(sys.path)
    add_search_paths(paths)
    try:
        yield
    finally:
        sys.path[:] = saved


def _forget_shadowed(module_name: str, paths: Sequence[str]) -> None:
    """Drop an imported ``module_name`` that is another file than the one ``paths`` hold:
    two sweeps in one process whose trainers are both ``train.py`` beside their sweep
    files must each get their own."""
    loaded = sys.modules.get(module_name)
    where = getattr(loaded, "__file__", None)
    if loaded is None or where is None:
        return
    rel = Path(*module_name.split("."))
    for folder in paths:
        for candidate in (Path(folder) / rel.with_suffix(".py"),
                          Path(folder) / rel / "__init__.py"):
            if candidate.is_file():
                if candidate.resolve() != Path(where).resolve():
                    for name in [m for m in sys.modules
                                 if m == module_name or m.startswith(module_name + ".")]:
                        del sys.modules[name]
                return


def _near_module(module_name: str, paths: Sequence[str]) -> str | None:
    """The module of ``paths``' folders (``*.py`` files, packages) closest to a top-level
    ``module_name`` that does not exist, else None."""
    if "." in module_name:
        return None
    names = {p.stem for folder in paths if Path(folder).is_dir()
             for p in Path(folder).iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    near = difflib.get_close_matches(module_name, sorted(names), n=1)
    return near[0] if near else None


def load_trainer(target: str, paths: Sequence[str] = (), key: str = "trainer") -> Trainer:
    """Import ``module:function`` and check it can be called as ``train(config, report)``."""
    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise SpecError(key, f"{target!r} is not of the form module:function",
                        "write e.g. 'sweeps.trainers.direction:train' or 'my_train:train'")
    _forget_shadowed(module_name, paths)
    from sweeps.trial.failures import install_exit_guard

    install_exit_guard()  # before the trainer module binds `from os import _exit`
    try:
        with on_sys_path(paths):
            module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        where = ", ".join(paths) if paths else "sys.path"
        near = _near_module(module_name, paths) \
            if isinstance(exc, ModuleNotFoundError) and exc.name == module_name else None
        hint = f"did you mean '{near}:{func_name}'? Else c" if near else "C"
        raise SpecError(key, f"module {module_name!r} does not import ({last})",
                        f"{hint}heck the module name and that it imports from {where}") \
            from exc
    func: Any = module
    for part in func_name.split("."):
        owner, func = func, getattr(func, part, None)
        if func is None:
            names = [n for n in dir(owner) if not n.startswith("_")
                     and callable(getattr(owner, n, None))]
            near = difflib.get_close_matches(part, names, n=1)
            fix = f"did you mean '{module_name}:{near[0]}'?" if near else \
                f"define 'def {func_name}(config, report)' in {module_name}"
            raise SpecError(key, f"{module_name!r} has no attribute {func_name!r}", fix)
    if not callable(func):
        raise SpecError(key, f"{target!r} is {a_type(func)}, not a function",
                        "point it at a function train(config, report)")
    try:
        inspect.signature(func).bind({}, lambda m: None)
    except TypeError as exc:
        raise SpecError(key, f"{target!r} cannot be called as train(config, report)",
                        "give it the signature train(config: dict, report) -> None") from exc
    except ValueError:
        pass  # builtins without a signature: trust them
    return func
