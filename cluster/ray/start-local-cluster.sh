#!/usr/bin/env bash
# Start a real multi-process Ray cluster on this machine: one head node and
# SWEEPS_RAY_WORKERS worker nodes, each a separate `ray start` (own raylet, object
# store and temp dir), for trying `sweeps submit` before a real cluster.
#
# Safe by default: the dashboard / Jobs API binds to 127.0.0.1 only, and token
# authentication is on (RAY_AUTH_MODE=token; the token is ~/.ray/auth_token, created
# if missing, readable by you alone). Idempotent: a running cluster recorded in
# $SWEEPS_RAY_DIR is left as is. The state folder is private: created with mode 700, and
# refused (nothing in it read) if it is not a folder of yours that only you can open.
# Each node runs in its own session (setsid); cluster.env records the session ids,
# which stop-local-cluster.sh stops, and nothing else (`ray stop` would stop every
# Ray on the machine, other users' included).
#
# Settings (environment variables):
#   SWEEPS_RAY_DIR             state and Ray temp dirs, private (mode 700)
#                              ($XDG_RUNTIME_DIR/sweeps-ray, else ~/.cache/sweeps/ray; keep it
#                              short: Ray's socket paths must fit 107 bytes)
#   SWEEPS_RAY_PORT            head GCS port              (6379)
#   SWEEPS_RAY_DASHBOARD_HOST  dashboard / Jobs API host  (127.0.0.1)
#   SWEEPS_RAY_DASHBOARD_PORT  dashboard / Jobs API port  (8265)
#   SWEEPS_RAY_CLIENT_PORT     ray:// port (needs ray[client]; Ray's default 10001; not in
#                              Ray's worker port range 10002-19999)
#   SWEEPS_RAY_AGENT_PORT      dashboard agent port of the head; worker i uses +i (52365)
#   SWEEPS_RAY_WORKERS         worker nodes               (1)
#   SWEEPS_RAY_CPUS            CPUs per node              (1)
#   SWEEPS_RAY_OBJECT_STORE    object store bytes per node (300000000)
#   SWEEPS_RAY_PYTHON          Python with ray[default] and sweeps (the project's .venv)
#   RAY_AUTH_MODE              token (default here) or disabled
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=sessions.sh
source "$here/sessions.sh"  # default_state_dir, make_private, check_record, session_pids, ours
dir="${SWEEPS_RAY_DIR:-$(default_state_dir)}"
port="${SWEEPS_RAY_PORT:-6379}"
dash_host="${SWEEPS_RAY_DASHBOARD_HOST:-127.0.0.1}"
dash_port="${SWEEPS_RAY_DASHBOARD_PORT:-8265}"
client_port="${SWEEPS_RAY_CLIENT_PORT:-}"
agent_port="${SWEEPS_RAY_AGENT_PORT:-52365}"
workers="${SWEEPS_RAY_WORKERS:-1}"
cpus="${SWEEPS_RAY_CPUS:-1}"
store="${SWEEPS_RAY_OBJECT_STORE:-300000000}"
if [[ -z "${SWEEPS_RAY_PYTHON:-}" && -x "$root/.venv/bin/python" ]]; then
  py="$root/.venv/bin/python"
else
  py="${SWEEPS_RAY_PYTHON:-python3}"
fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
# the job's `python -m sweeps run ...` must find this Python first
PATH="$(dirname "$(command -v "$py")"):$PATH"
export PATH
ray_cli=("$py" -c 'import sys; from ray.scripts.scripts import main; sys.exit(main())')
record="$dir/cluster.env"

die() { echo "start-local-cluster: $*" >&2; exit 1; }

if [[ -n "$client_port" ]] && (( client_port >= 10002 && client_port <= 19999 )); then
  die "SWEEPS_RAY_CLIENT_PORT=$client_port is in Ray's worker port range 10002-19999: pick one outside it (e.g. $((port + 3000)))"
fi
make_private "$dir"
# the longest socket path Ray will make under $dir (a 7-digit pid in the session name)
longest="$dir/worker$workers/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
(( $(printf %s "$longest" | wc -c) <= 107 )) || die "the state folder $dir is too long: \
Ray's socket paths under it would pass 107 bytes. Set SWEEPS_RAY_DIR to a shorter folder of \
yours, e.g. SWEEPS_RAY_DIR=\$(mktemp -d /tmp/swr-XXXXXXXX)"

if [[ -e "$record" || -L "$record" ]]; then
  check_record "$record"
  # shellcheck disable=SC1090
  source "$record"
  if ours "$SWEEPS_RAY_HEAD_SID"; then
    echo "Ray cluster already running (head session $SWEEPS_RAY_HEAD_SID)"
    echo "  Jobs API: $SWEEPS_RAY_DASHBOARD   GCS: $SWEEPS_RAY_GCS"
    exit 0
  fi
  echo "start-local-cluster: the recorded cluster is gone; cleaning up its leftovers" >&2
  SWEEPS_RAY_DIR="$dir" "$here/stop-local-cluster.sh" >/dev/null || true
fi

"$py" -c 'import ray.dashboard.optional_deps' 2>/dev/null || die \
  "$py has no Ray dashboard (no Jobs API): it needs ray[default]. Install it
  (pip install 'ray[default]==$("$py" -c 'import ray; print(ray.__version__)' 2>/dev/null)') or
  set SWEEPS_RAY_PYTHON to a Python that has it (and sweeps)."
"$py" -c 'import sweeps' 2>/dev/null || die "$py cannot import sweeps (pip install -e $root)"

if [[ "${RAY_AUTH_MODE,,}" == token && -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" \
      && ! -s "$HOME/.ray/auth_token" ]]; then
  # Ray writes it with the umask (0644 in a 0755 ~/.ray); whoever reads it can run code here
  (umask 077 && "${ray_cli[@]}" get-auth-token --generate >/dev/null)
  echo "created a Ray auth token in ~/.ray/auth_token (readable by you alone)"
fi

started=()
cleanup_failed() {
  echo "start-local-cluster: $1; logs in $dir/*.log" >&2
  for sid in "${started[@]}"; do session_pids "$sid" | xargs -r kill -KILL 2>/dev/null || true; done
  rm -f "$record"
  exit 1
}

# start_node NAME ARGS...: `ray start` in a new session; sets $sid to that session's id
start_node() {
  local name="$1"; shift
  ( exec setsid "${ray_cli[@]}" start --temp-dir "$dir/$name" --disable-usage-stats \
      --num-cpus "$cpus" --object-store-memory "$store" "$@" </dev/null >"$dir/$name.log" 2>&1 ) &
  sid=$!
  started+=("$sid")
  wait "$sid" || cleanup_failed "ray start of the $name node failed: $(tail -n 3 "$dir/$name.log")"
  [[ -n "$(session_pids "$sid")" ]] ||
    cleanup_failed "the $name node's processes are not in session $sid"
}

head_args=(--head --port "$port" --dashboard-host "$dash_host" --dashboard-port "$dash_port"
           --dashboard-agent-listen-port "$agent_port")
if [[ -n "$client_port" ]]; then head_args+=(--ray-client-server-port "$client_port"); fi
start_node head "${head_args[@]}"
head_sid="$sid"
worker_sids=()
url="http://$dash_host:$dash_port"
gcs="$(cat "$dir/head/ray_current_cluster" 2>/dev/null)" || cleanup_failed "no GCS address recorded"

# what stop-local-cluster.sh stops; rewritten after every node, so nothing started goes unrecorded
save_record() {
  cat >"$record" <<EOF
SWEEPS_RAY_HEAD_SID=$head_sid
SWEEPS_RAY_WORKER_SIDS="${worker_sids[*]}"
SWEEPS_RAY_GCS=$gcs
SWEEPS_RAY_DASHBOARD=$url
SWEEPS_RAY_PYTHON=$py
SWEEPS_RAY_AUTH_MODE=$RAY_AUTH_MODE
EOF
}
save_record
for i in $(seq 1 "$workers"); do
  start_node "worker$i" --address "$gcs" --dashboard-agent-listen-port "$((agent_port + i))"
  worker_sids+=("$sid")
  save_record
done

# ready when every node is alive and the Jobs API answers (401 = up, asking for the token)
api_up() {
  "$py" - "$1" <<'EOF'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/api/version", timeout=5)
except urllib.error.HTTPError as exc:
    sys.exit(exc.code != 401)
except OSError:
    sys.exit(1)
EOF
}
want=$((workers + 1))
ready=0
for _ in $(seq 1 60); do
  alive="$("${ray_cli[@]}" status --address "$gcs" 2>/dev/null | grep -c '^ 1 node_' || true)"
  if [[ "$alive" == "$want" ]] && api_up "$url"; then ready=1; break; fi
  sleep 1
done
((ready)) ||
  cleanup_failed "not ready after 60 s: ${alive:-0} of $want nodes alive, Jobs API at $url"

echo "Ray cluster up: head + $workers worker node(s), $cpus CPU(s) each (state: $dir)"
echo "  Jobs API / dashboard: $url   (bound to $dash_host)"
echo "  GCS address:          $gcs   (sweeps run FILE --address $gcs)"
if [[ "${RAY_AUTH_MODE,,}" == token ]]; then
  echo "  token auth:           on (token: ${RAY_AUTH_TOKEN_PATH:-~/.ray/auth_token})"
else
  echo "  token auth:           OFF: anyone who reaches these ports can run code here"
fi
echo "  submit:  sweeps submit FILE --address $url --storage /shared/results --wait"
# the stop command names this cluster's state folder: run in another shell (or after a
# start with its own SWEEPS_RAY_DIR), it would otherwise look in the default one
echo "  stop:    SWEEPS_RAY_DIR=$(printf %q "$dir") $(printf %q "$here/stop-local-cluster.sh")"
