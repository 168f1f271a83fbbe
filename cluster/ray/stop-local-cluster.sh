#!/usr/bin/env bash
# Stop the Ray cluster start-local-cluster.sh started, and nothing else: the processes
# of the node sessions recorded in $SWEEPS_RAY_DIR/cluster.env (SIGTERM, then SIGKILL
# after SWEEPS_RAY_STOP_GRACE seconds, 10 by default). Jobs still running end with
# their supervisor. Logs stay in $SWEEPS_RAY_DIR unless SWEEPS_RAY_CLEAN=1.
# (`ray stop` is not used: it stops every Ray process on the machine.) cluster.env is
# read only from a folder of yours that only you can open (see sessions.sh).
set -euo pipefail

# shellcheck source=sessions.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/sessions.sh"
dir="${SWEEPS_RAY_DIR:-$(default_state_dir)}"
grace="${SWEEPS_RAY_STOP_GRACE:-10}"
record="$dir/cluster.env"

if [[ ! -e "$record" && ! -L "$record" ]]; then
  echo "no local Ray cluster recorded in $dir; nothing to stop"
  exit 0
fi
check_private "$dir"
check_record "$record"
# shellcheck disable=SC1090
source "$record"

sessions=()
# shellcheck disable=SC2086
for sid in $SWEEPS_RAY_WORKER_SIDS $SWEEPS_RAY_HEAD_SID; do
  if ours "$sid"; then sessions+=("$sid"); fi
done

pids() { for sid in "${sessions[@]}"; do session_pids "$sid"; done; }

if ((${#sessions[@]})); then
  pids | xargs -r kill -TERM 2>/dev/null || true
  for _ in $(seq 1 "$grace"); do
    [[ -z "$(pids)" ]] && break
    sleep 1
  done
  left="$(pids)"
  if [[ -n "$left" ]]; then
    echo "$(echo "$left" | wc -l) process(es) ignored SIGTERM for ${grace}s; sending SIGKILL"
    echo "$left" | xargs -r kill -KILL 2>/dev/null || true
    for _ in 1 2 3 4 5; do [[ -z "$(pids)" ]] && break; sleep 1; done
  fi
  echo "stopped the local Ray cluster (sessions ${sessions[*]})"
else
  echo "the recorded cluster was no longer running"
fi
rm -f "$record"
if [[ "${SWEEPS_RAY_CLEAN:-0}" == 1 ]]; then
  rm -rf "$dir"
else
  echo "logs kept in $dir (SWEEPS_RAY_CLEAN=1 removes them)"
fi
