"""What ``sweeps submit`` sends: the project folder, the entrypoint and the job's environment.

Everything here is checked on the submitting machine, so bad input fails (exit 2)
before anything reaches the cluster.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from sweeps.errors import SpecError
from sweeps.protocol import SUBMITTED_FROM_ENV
from sweeps.tune.compat import ray_excludes, ray_walk_upload

#: Never shipped as a secret: environment files, private keys, credentials (gitwildmatch, at
#: any depth). SSH keys by their names (``id_rsa*`` ...): a plain ``id_*`` would also drop
#: a module such as ``id_utils.py``.
SECRETS = [
    ".env", ".env.*", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".netrc", ".pypirc", ".git-credentials", ".ssh/", ".aws/", ".docker/",
]
#: Never shipped: secrets, results, environments, VCS and caches (gitwildmatch, relative to
#: the project folder). Ray also skips what the project's .gitignore / .rayignore list.
EXCLUDES = SECRETS + [
    ".git/", ".venv/", "venv/", ".tox/", ".nox/", "__pycache__/", "*.pyc",
    ".pytest_cache/", ".ruff_cache/", ".mypy_cache/", ".hypothesis/", "*.egg-info/",
    "node_modules/", "mlruns/", "/results/",
]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Submission:
    """One job for the Jobs API: ``client.submit_job(**submission.kwargs())``."""

    sweep_name: str
    sweep_path: str  # relative to the project folder, POSIX
    project_dir: Path
    entrypoint: str
    runtime_env: dict[str, Any]
    submission_id: str
    metadata: dict[str, str] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        return {"entrypoint": self.entrypoint, "runtime_env": self.runtime_env,
                "submission_id": self.submission_id, "metadata": self.metadata}


def project_folder(project_dir: str | None, workdir: Path) -> Path:
    """The folder shipped as the job's working dir: ``--project-dir`` (relative to
    ``workdir``, the folder sweeps was started from) or ``workdir`` itself."""
    folder = workdir / Path(project_dir).expanduser() if project_dir else workdir
    if not folder.is_dir():
        raise SpecError("--project-dir", f"{folder} is not a folder",
                        "give the folder that holds your sweep file, trainer and configs")
    return folder.resolve()


def relative_sweep_path(file: str, project: Path, workdir: Path) -> PurePosixPath:
    """The sweep file's path inside the project folder (what the job's command names);
    a relative ``file`` starts at ``workdir``."""
    path = workdir / Path(file).expanduser()
    if not path.is_file():
        from sweeps.spec.loader import no_sweep_file

        raise no_sweep_file(path, path)
    try:
        rel = path.resolve().relative_to(project)
    except ValueError:
        raise SpecError("FILE", f"{path} is outside the project folder {project}, and only "
                        "that folder is shipped to the cluster",
                        "run from your project folder or pass --project-dir DIR") from None
    return PurePosixPath(rel.as_posix())


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``--env K=V`` pairs as a mapping."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise SpecError(f"--env {pair}", "not of the form NAME=value",
                            "write e.g. --env OMP_NUM_THREADS=1")
        env[key] = value
    return env


def excludes_for(output: str, storage: str | None) -> list[str]:
    """``EXCLUDES`` plus the sweep's results folder when it lies inside the project."""
    extra = []
    for folder in (output, storage):
        parts = Path(folder).parts if folder else ()
        if parts and not Path(folder).is_absolute() and ".." not in parts:
            extra.append("/" + "/".join(parts) + "/")
    return list(dict.fromkeys(EXCLUDES + extra))


def entrypoint(sweep_path: PurePosixPath, storage: str | None, preflight: bool) -> str:
    """``python -m sweeps run <sweep> [--output <storage>] [--no-preflight]``."""
    cmd = ["python", "-m", "sweeps", "run", str(sweep_path)]
    if storage:
        cmd += ["--output", storage]
    if not preflight:
        cmd.append("--no-preflight")
    return shlex.join(cmd)


def runtime_env(project: Path, sweep_path: PurePosixPath, *, output: str,
                storage: str | None, pip: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """The job's runtime_env: the project as working dir, pip packages, env vars (with
    :data:`~sweeps.protocol.SUBMITTED_FROM_ENV`: the sweep file the user submitted).

    A trainer module beside a sweep file in a subfolder is put on the workers'
    ``PYTHONPATH`` as a path relative to the working dir, which Ray unpacks on every node.
    """
    env = {**env, SUBMITTED_FROM_ENV: str(project.absolute() / sweep_path)}
    folder = str(sweep_path.parent)
    if folder != ".":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
    renv: dict[str, Any] = {"working_dir": str(project),
                            "excludes": excludes_for(output, storage)}
    if pip:
        renv["pip"] = list(pip)
    if env:
        renv["env_vars"] = env
    return renv


def shipped_files(project: Path, excludes: Sequence[str]) -> list[Path]:
    """The files Ray will pack as the job's working dir, relative to ``project``: what
    remains after ``excludes`` and the project's ``.gitignore`` / ``.rayignore`` files (at
    every level; ``.gitignore`` not when ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``).

    This walks the folder with the very functions Ray packs it with (gitwildmatch
    patterns through ``pathspec``), so the list is what the upload holds."""
    root = project.absolute()
    found: list[Path] = []

    def take(path: Path) -> None:
        if path.is_file():
            found.append(path.relative_to(root))

    gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    ray_walk_upload(root, excludes, take, include_gitignore=gitignore,
                    logger=logging.getLogger(__name__))  # not Ray's, which says "Ignoring ..."
    return sorted(found)


def left_out_secrets(project: Path, shipped: Sequence[Path]) -> list[Path]:
    """Files in ``project`` that :data:`SECRETS` keeps from the upload (for the dry run)."""
    root = project.absolute()
    is_secret = ray_excludes(root, SECRETS)
    kept = set(shipped)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv", "node_modules")]
        for name in filenames:
            path = Path(dirpath) / name
            if is_secret(path) and path.relative_to(root) not in kept:
                out.append(path.relative_to(root))
    return sorted(out)


def submission_id(sweep_name: str) -> str:
    """A readable, unique job id: ``sweeps-<name>-<yymmdd-HHMMSS>-<4 hex>``."""
    stamp = datetime.now().strftime("%y%m%d-%H%M%S")
    return f"sweeps-{sweep_name}-{stamp}-{secrets.token_hex(2)}"


def build(file: str, *, workdir: Path, project_dir: str | None, storage: str | None,
          preflight: bool, pip: Sequence[str] = (), env_pairs: Sequence[str] = ()
          ) -> Submission:
    """Validate the sweep as the cluster will see it and build its submission.

    ``workdir`` is the folder sweeps was started from (relative ``file`` and
    ``project_dir`` start there). The sweep file is loaded (trainer import included) with
    the project folder as its working directory, so relative paths resolve as they will in
    the job's working dir.
    """
    from sweeps.spec.loader import load_sweep

    project = project_folder(project_dir, workdir)
    rel = relative_sweep_path(file, project, workdir)
    env = parse_env(env_pairs)
    if storage is not None and not storage.strip():
        raise SpecError("--storage", "is empty", "give a folder every node can reach")
    sweep = load_sweep(project / rel, workdir=project)
    renv = runtime_env(project, rel, output=sweep.spec.output, storage=storage, pip=pip,
                       env=env)
    return Submission(
        sweep_name=sweep.name, sweep_path=str(rel), project_dir=project,
        entrypoint=entrypoint(rel, storage, preflight), runtime_env=renv,
        submission_id=submission_id(sweep.name),
        metadata={"sweeps.sweep": sweep.name, "sweeps.file": str(rel),
                  "sweeps.storage": storage or f"(job working dir)/{sweep.spec.output}"})
