# Sourced by start-local-cluster.sh and stop-local-cluster.sh (not run on its own):
# where the cluster's state lives, the checks made before trusting it, and how both
# find the processes of a node session and tell whether it is still ours.

# refuse MESSAGE: print it with the calling script's name and exit 1
refuse() { echo "${0##*/}: $*" >&2; exit 1; }

# The state folder (cluster.env, the nodes' Ray temp dirs and logs) unless SWEEPS_RAY_DIR
# says otherwise: $XDG_RUNTIME_DIR/sweeps-ray (a private tmpfs of this login, removed at
# logout) if there is one of ours, else ~/.cache/sweeps/ray.
default_state_dir() {
  if [[ -n "${XDG_RUNTIME_DIR:-}" && -d "$XDG_RUNTIME_DIR" && ! -L "$XDG_RUNTIME_DIR" \
        && -O "$XDG_RUNTIME_DIR" ]]; then
    echo "$XDG_RUNTIME_DIR/sweeps-ray"
  else
    echo "${HOME:?HOME is not set}/.cache/sweeps/ray"
  fi
}

# check_private DIR: go on only if DIR is a real folder (no symlink), owned by this user,
# that no one else can open (no group/other bits): cluster.env in it is sourced, i.e. run.
check_private() {
  local d="$1" owner mode
  [[ -L "$d" ]] && refuse "$d is a symlink: the state folder must be a real folder of yours. \
Nothing in it was read. Remove it, or set SWEEPS_RAY_DIR to a folder only you can open (mode 700)."
  [[ -d "$d" ]] || refuse "$d is not a folder. Nothing in it was read. Remove it, or set \
SWEEPS_RAY_DIR to another."
  owner="$(stat -c %u -- "$d")" mode="$(stat -c %a -- "$d")"
  [[ "$owner" == "$(id -u)" ]] || refuse "$d belongs to user $(stat -c %U -- "$d") (uid \
$owner), not to you: its cluster.env would run as you. Nothing in it was read. Set \
SWEEPS_RAY_DIR to a folder of your own (mode 700)."
  (( (8#$mode & 8#077) == 0 )) || refuse "$d has mode $mode: other users can open it (and \
read the nodes' logs) or plant a cluster.env in it. Nothing in it was read. If it is yours: \
chmod 700 $d"
}

# make_private DIR: create DIR (mode 700) if missing, then check_private it
make_private() {
  [[ -e "$1" || -L "$1" ]] || (umask 077 && mkdir -p -- "$1")
  check_private "$1"
}

# check_record FILE: FILE may be sourced: a regular file of ours, not a symlink, writable
# by no one else (its folder passed check_private)
check_record() {
  local f="$1" mode
  if [[ -L "$f" || ! -f "$f" || "$(stat -c %u -- "$f")" != "$(id -u)" ]]; then
    refuse "$f is not a regular file of yours; it was not read. Remove it."
  fi
  mode="$(stat -c %a -- "$f")"
  (( (8#$mode & 8#022) == 0 )) || refuse "$f (mode $mode) is writable by others; it was not \
read. Remove it."
}

# pids of the live (not zombie) processes of session $1
session_pids() { ps -eo pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ {print $1}'; }

# is session $1 still a Ray node of ours? Only if its processes name our temp dir
# (session ids get reused). Needs $dir, the cluster's state and temp dir.
ours() {
  local pid
  for pid in $(session_pids "$1"); do
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/"; then return 0; fi
  done
  return 1
}
