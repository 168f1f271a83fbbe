"""A shared machine: what other local users (and the network) can see of a sweep.

Real processes throughout. Tests run as one user, so "another user cannot read it" is
checked through file modes: a file is readable by others only if it has a group/other
read bit and every folder above it lets others in.

* The embedded Ray runs in a private folder (0700) removed at the end, listens on
  loopback only, and the AWS secret Ray Tune copies into every trial stays behind 0700
  folders and 0600 files (a real ``sweeps run`` with ``AWS_SECRET_ACCESS_KEY`` set).
* What a SIGKILLed driver leaves is ended on the next start.
* ``sweeps submit`` / ``jobs`` send the Ray token only over https or to loopback (a real
  HTTP server on a non-loopback address of this machine records every header).
* ``submit --dry-run`` lists what would ship, without ``.env`` or ``id_rsa``, exactly as
  Ray packs it.
* The local-cluster scripts source ``cluster.env`` only from a private folder of ours.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sweeps.cluster import auth, jobs, package
from sweeps.commands.cli import main
from sweeps.errors import SpecError
from sweeps.tune import session as ray_session
from tests.conftest import SWEEPFILES, copy_sweepfiles, edit_linreg, read_results_csv

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "cluster" / "ray"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", ray_session.SESSION_VAR, "RAY_TMPDIR",
                        "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture
def short_tmp():
    """A short private folder under /tmp, used as $TMPDIR (Ray's socket paths are short)."""
    base = Path(tempfile.mkdtemp(prefix="swt-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def readable_by_others(path: Path) -> bool:
    """Could another local user read ``path``? (a read bit for group or other, and a way
    in through every folder above it)"""
    if not path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
        return False
    return all(p.stat().st_mode & (stat.S_IXGRP | stat.S_IXOTH) for p in path.parents)


def files_holding(folder: Path, needle: bytes) -> list[Path]:
    found = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = Path(dirpath) / name
            try:
                if not path.is_symlink() and needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def listening(pids: set[int]) -> list[str]:
    """The local addresses ``pids`` listen on (TCP, from /proc: no `ss` needed)."""
    inodes = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                out.append(_address(cols[1], width))
    return out


def _address(hex_addr: str, width: int) -> str:
    ip_hex, port = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    if width == 8:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(
            raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port, 16)}"


def is_loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0]
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or \
        host.startswith("::ffff:127.")


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo.extend(children.get(p, []))
    return out


# --- the embedded Ray ----------------------------------------------------------------------

DYING_TRAINER = '''
import os, signal
from linreg_trainer import train as linreg

def train(config, report):
    print("trainer says: secret is", os.environ.get("AWS_SECRET_ACCESS_KEY"), flush=True)
    def checked(metrics):
        report(metrics)
        if config["train"]["lr"] > 1.0 and metrics.get("step") == 1:
            print("dying now", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # as a segfault or the OOM killer would
    linreg(config, checked)
'''


@pytest.mark.slow
def test_an_embedded_sweep_keeps_its_secrets_and_ports_to_itself(tmp_path, short_tmp):
    """A real `sweeps run` with AWS_SECRET_ACCESS_KEY set, one trial's worker dying."""
    folder = copy_sweepfiles(tmp_path)
    (folder / "dying_trainer.py").write_text(DYING_TRAINER)
    edit_linreg(folder, trainer="dying_trainer:train", initial_points=[{"lr": 5.0},
                {"lr": 0.05}], budget={"trials": 3, "max_steps": 30, "max_failures": 0},
                confirm={"seeds": 0})
    secret = "AKIA" + secrets.token_hex(12)
    started = time.time()
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweeps", "run", "linreg.yaml", "--quiet", "--no-preflight"],
        cwd=folder, env=_env(TMPDIR=str(short_tmp), AWS_SECRET_ACCESS_KEY=secret),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and driver.poll() is None:
            private = sorted(short_tmp.glob(f"{ray_session.PREFIX}*"))
            holding = files_holding(private[0], secret.encode()) if private else []
            if holding:
                seen.update(private=private[0], holding=[p.name for p in holding],
                            open_to_others=[p for p in holding if readable_by_others(p)],
                            mode=private[0].stat().st_mode & 0o777,
                            uid=private[0].stat().st_uid,
                            ports=listening(_descendants(driver.pid)))
                break
            time.sleep(0.5)
        out = driver.communicate(timeout=300)[0]
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out[-3000:]
    assert seen, "the secret never showed up in the run's Ray folder: nothing was tested"
    # during the run: the secret Ray Tune copies into trials sits behind a 0700 folder
    assert seen["mode"] == 0o700 and seen["uid"] == os.getuid()
    assert "runtime_env_agent.log" in seen["holding"]
    assert not seen["open_to_others"]
    # every port of the driver, the GCS, the raylet, the agents and the workers: loopback
    assert seen["ports"] and all(is_loopback(a) for a in seen["ports"]), seen["ports"]
    # after: the private folder is gone, nothing of it in the shared /tmp/ray
    assert not list(short_tmp.glob(f"{ray_session.PREFIX}*"))
    for log in Path("/tmp/ray").glob("session_*/logs/runtime_env_agent.log"):
        if log.stat().st_mtime >= started:
            assert secret.encode() not in log.read_bytes()
    # the dead worker's output survives, for its user alone
    results = folder / "results" / "linreg"
    kept = list((results / "trials").glob("*.worker.log"))
    assert len(kept) == 1, out[-2000:]
    assert kept[0].stat().st_mode & 0o777 == 0o600
    assert "dying now" in kept[0].read_text()
    rows = read_results_csv(results / "trials.csv")
    died = rows[rows["trial_id"] == kept[0].name.split(".")[0]].iloc[0]
    assert str(kept[0]) in died["evidence"], "the trial's evidence names the kept output"
    assert not [p for p in files_holding(results, secret.encode())
                if p.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH)]


HOLD = """
import sys, time
from sweeps.tune.session import ray_running
with ray_running(num_cpus=1) as session:
    print(session.folder, flush=True)
    time.sleep(float(sys.argv[1]))
"""


@pytest.mark.slow
def test_what_a_killed_driver_leaves_is_ended_on_the_next_start(short_tmp):
    env = _env(TMPDIR=str(short_tmp))
    driver = subprocess.Popen([sys.executable, "-c", HOLD, "300"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        private = Path(driver.stdout.readline().strip())
        assert private.parent == short_tmp
        time.sleep(2)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        time.sleep(3)
        left = ray_session.session_pids(private)  # Ray's agents outlive the driver (~60 s)
        assert private.is_dir()
        again = subprocess.run([sys.executable, "-c", HOLD, "0"], env=env, text=True,
                               capture_output=True, timeout=180)
        assert again.returncode == 0, again.stderr[-2000:]
        assert not private.exists()
        assert not ray_session.session_pids(private)
        assert not any(ray_session.is_alive(p) for p in left)
        if left:
            assert f"removed its folder {private}" in again.stderr
        assert not list(short_tmp.glob(f"{ray_session.PREFIX}*")), "the second run cleaned up"
    finally:
        if driver.poll() is None:
            driver.kill()


def _record(folder: Path, **fields) -> Path:
    folder.mkdir(mode=0o700)
    (folder / ray_session.OWNER).write_text(json.dumps(
        {"pid": os.getpid(), "start": ray_session.start_ticks(os.getpid()),
         "host": socket.gethostname(), "kept": False, **fields}))
    return folder


def test_only_a_dead_drivers_private_folder_is_reaped(tmp_path):
    p = ray_session.PREFIX
    live = _record(tmp_path / f"{p}live")
    dead = _record(tmp_path / f"{p}dead", start=1)  # our pid, another start: a reused pid
    kept = _record(tmp_path / f"{p}kept", start=1, kept=True)
    other_host = _record(tmp_path / f"{p}host", start=1, host="elsewhere")
    shared = _record(tmp_path / f"{p}shared", start=1)
    shared.chmod(0o755)
    orphan = subprocess.Popen(["sleep", "300"],
                              env={**os.environ, ray_session.SESSION_VAR: str(dead)})
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        assert ray_session.session_pids(dead) == [orphan.pid]
        assert ray_session.reap_orphans(tmp_path) == [dead]
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None
        assert {f.name for f in tmp_path.iterdir()} == {
            live.name, kept.name, other_host.name, shared.name}
    finally:
        for proc in (orphan, stranger):
            proc.kill()
            proc.wait()


def test_a_tmpdir_too_long_for_rays_sockets_is_passed_over(monkeypatch, tmp_path, short_tmp):
    long_dir = tmp_path / ("x" * 90)
    long_dir.mkdir()
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(long_dir))
    assert ray_session.temp_base() == Path("/tmp")
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    assert ray_session.temp_base() == short_tmp
    monkeypatch.setenv("TMPDIR", str(long_dir))
    monkeypatch.setattr(ray_session, "FALLBACK_TMP", str(long_dir))
    with pytest.raises(SpecError) as err:
        ray_session.temp_base()
    assert err.value.key == "TMPDIR" and "107 bytes" in err.value.problem


# --- the Ray token over the network --------------------------------------------------------

def test_the_token_goes_over_https_or_to_loopback_only():
    for url in ("https://head:8265", "http://127.0.0.1:8265", "http://127.0.0.2:1",
                "http://localhost:8265", "http://[::1]:8265", "http://[::ffff:127.0.0.1]:1"):
        assert auth.token_may_go_to(url), url
    for url in ("http://head:8265", "http://10.0.0.5:8265", "http://[2001:db8::1]:8265",
                "http://localhost.example.com:8265", "http://0.0.0.0:8265"):
        assert not auth.token_may_go_to(url), url


def test_a_localhost_name_is_judged_by_the_address_it_resolves_to(monkeypatch):
    """``*.localhost`` names may point anywhere (a hosts file, a resolver): the token goes
    over plain http only where every address the name resolves to is loopback."""
    import socket

    table = {"tunnel.localhost": ["127.0.0.1"], "evil.localhost": ["10.0.0.5"],
             "both.localhost": ["127.0.0.1", "192.0.2.7"]}

    def resolve(host, *args, **kwargs):
        if host not in table:
            raise socket.gaierror(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in table[host]]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)  # a resolver we cannot plant for real
    assert auth.token_may_go_to("http://tunnel.localhost:8265")
    assert not auth.token_may_go_to("http://evil.localhost:8265")
    assert not auth.token_may_go_to("http://both.localhost:8265")
    assert not auth.token_may_go_to("http://unknown.localhost:8265"), "unresolved: no"


class _Dashboard(BaseHTTPRequestHandler):
    """A stand-in Jobs API asking for the token; records every Authorization header."""

    token = ""
    ask_token = True
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        header = self.headers.get("Authorization")
        type(self).seen.append(header)
        if self.ask_token and header != f"Bearer {self.token}":
            self._answer(401, {"error": "Unauthorized"})
        elif self.path.startswith("/api/version"):
            self._answer(200, {"ray_version": "2.60.0", "version": "4",
                               "session_name": "fake"})
        else:
            self._answer(200, [])

    def _answer(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, or None."""
    candidates = []
    try:
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
            candidates.append(s.getsockname()[0])
    except OSError:
        pass
    return next((a for a in candidates if not a.startswith("127.")), None)


@pytest.fixture
def dashboard(request):
    """(URL, handler class) of a stand-in Jobs API on the given host."""
    host = request.param if hasattr(request, "param") else "127.0.0.1"
    if host == "non-loopback":
        host = _non_loopback_address()
        if host is None:
            pytest.skip("this machine has no non-loopback address")
    handler = type("Handler", (_Dashboard,), {"token": secrets.token_hex(16), "seen": []})
    server = ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{host}:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _with_token(monkeypatch, token: str) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # Ray's own client would add it too


@pytest.mark.parametrize("dashboard", ["non-loopback"], indirect=True)
def test_no_token_over_plain_http_to_another_host(dashboard, monkeypatch, capsys):
    url, handler = dashboard
    _with_token(monkeypatch, handler.token)
    assert main(["jobs", "list", "--address", url]) == 2
    err = capsys.readouterr().err
    assert "--address" in err and "ssh -N -L 8265:127.0.0.1:8265" in err
    assert "https" in err and "--allow-insecure-token" in err
    assert handler.seen and not any(h and handler.token in h for h in handler.seen)


@pytest.mark.parametrize("dashboard", ["non-loopback"], indirect=True)
def test_allow_insecure_token_sends_it_and_warns(dashboard, monkeypatch, capsys):
    url, handler = dashboard
    _with_token(monkeypatch, handler.token)
    assert main(["jobs", "list", "--address", url, "--allow-insecure-token"]) == 0
    captured = capsys.readouterr()
    assert "warning: sending the Ray auth token over plain http" in captured.err
    assert f"Bearer {handler.token}" in handler.seen


def test_the_token_goes_to_a_tunnel_on_loopback(dashboard, monkeypatch, capsys):
    url, handler = dashboard
    _with_token(monkeypatch, handler.token)
    assert main(["jobs", "list", "--address", url]) == 0
    assert "warning" not in capsys.readouterr().err
    assert f"Bearer {handler.token}" in handler.seen


@pytest.mark.parametrize("dashboard", ["non-loopback"], indirect=True)
def test_rays_own_client_adds_no_token_over_plain_http(dashboard, monkeypatch):
    """A cluster without token auth over plain http: RAY_AUTH_MODE=token in the user's
    environment must not make Ray's own client attach the token to its requests."""
    url, handler = dashboard
    handler.ask_token = False
    _with_token(monkeypatch, handler.token)
    jobs.connect(url).list_jobs()
    assert len(handler.seen) >= 3 and not any(handler.seen), handler.seen
    assert os.environ["RAY_AUTH_MODE"] == "token", "the user's setting is put back"


# --- what submit ships ---------------------------------------------------------------------

def _project(root: Path) -> Path:
    exp = root / "exp"
    exp.mkdir(parents=True)
    for f in SWEEPFILES.glob("linreg*"):
        shutil.copy(f, exp / f.name)
    (root / ".env").write_text("AWS_SECRET_ACCESS_KEY=do-not-ship\n")
    (root / "exp" / ".env.local").write_text("TOKEN=do-not-ship\n")
    (root / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (root / "id_utils.py").write_text("ID = 1\n")  # a module, not a key: shipped
    (root / "certs").mkdir()
    (root / "certs" / "server.pem").write_text("key\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "big.csv").write_text("1\n")
    (root / "exp" / ".rayignore").write_text("scratch.txt\n")
    (root / "exp" / "scratch.txt").write_text("x\n")
    (root / "results").mkdir()
    (root / "results" / "old.csv").write_text("x\n")
    return root


def test_submit_dry_run_lists_what_ships_and_never_a_secret(tmp_path, capsys):
    project = _project(tmp_path / "proj")
    assert main(["submit", str(project / "exp" / "linreg.yaml"), "--project-dir",
                 str(project), "--dry-run", "--address", "http://10.0.0.1:1"]) == 0
    out, err = capsys.readouterr()
    listed = set(out.split())
    assert listed == {".gitignore", "id_utils.py", "exp/.rayignore", "exp/linreg.yaml",
                      "exp/linreg_config.yaml", "exp/linreg_trainer.py"}
    assert "dry run" in err and "python -m sweeps run exp/linreg.yaml" in err
    assert "never shipped (secrets): .env, certs/server.pem, exp/.env.local, id_rsa" in err


def test_the_listing_is_what_ray_packs(tmp_path):
    """Ray's own packer, given the same excludes, zips exactly the listed files."""
    from ray._private.runtime_env.packaging import _zip_files

    project = _project(tmp_path / "proj")
    sub = package.build(str(project / "exp" / "linreg.yaml"), workdir=tmp_path,
                        project_dir=str(project), storage=None, preflight=True)
    listed = {p.as_posix() for p in package.shipped_files(project,
                                                          sub.runtime_env["excludes"])}
    zipped = tmp_path / "pkg.zip"
    _zip_files(str(project), sub.runtime_env["excludes"], str(zipped), include_gitignore=True)
    with zipfile.ZipFile(zipped) as z:
        packed = {n for n in z.namelist() if not n.endswith("/")}
    assert packed == listed
    assert not {".env", "id_rsa", "exp/.env.local", "certs/server.pem"} & packed


# --- the local-cluster scripts' state folder -----------------------------------------------

PLANTED = "touch {marker}\nSWEEPS_RAY_HEAD_SID=1\nSWEEPS_RAY_WORKER_SIDS=\n"


@pytest.mark.parametrize("script", ["start-local-cluster.sh", "stop-local-cluster.sh"])
@pytest.mark.parametrize("how", ["open", "symlink", "foreign"])
def test_a_planted_cluster_env_is_never_sourced(tmp_path, script, how):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    marker = tmp_path / "ran"
    (state / "cluster.env").write_text(PLANTED.format(marker=marker))
    target = state
    if how == "open":
        state.chmod(0o755)
    elif how == "symlink":
        target = tmp_path / "link"
        target.symlink_to(state)
    elif os.getuid() == 0:
        os.chown(state, 65534, 65534)  # nobody's
    else:
        pytest.skip("needs root to hand a folder to another user")
    done = subprocess.run([str(SCRIPTS / script)], env=_env(SWEEPS_RAY_DIR=str(target)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert not marker.exists(), "the planted cluster.env ran"
    assert str(target) in done.stderr and "Nothing in it was read" in done.stderr


def test_the_state_folder_is_made_private(tmp_path):
    """start creates its default state folder 0700 (here under $XDG_RUNTIME_DIR)."""
    runtime = Path(tempfile.mkdtemp(prefix="swx-", dir="/tmp"))
    try:
        done = subprocess.run(
            ["bash", "-c", f"source {SCRIPTS / 'sessions.sh'}; d=$(default_state_dir); "
                           "make_private \"$d\"; echo \"$d\""],
            env=_env(XDG_RUNTIME_DIR=str(runtime)), capture_output=True, text=True)
        made = Path(done.stdout.strip())
        assert done.returncode == 0, done.stderr
        assert made == runtime / "sweeps-ray"
        assert made.stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_state_folder_defaults_under_the_home_cache(tmp_path):
    done = subprocess.run(
        ["bash", "-c", f"source {SCRIPTS / 'sessions.sh'}; default_state_dir"],
        env={**_env(HOME=str(tmp_path)), "XDG_RUNTIME_DIR": ""}, capture_output=True,
        text=True)
    assert done.stdout.strip() == f"{tmp_path}/.cache/sweeps/ray"
