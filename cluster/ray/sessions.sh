# Sourced by start-local-cluster.sh and stop-local-cluster.sh (not run on its own):
# how both find the processes of a node session and tell whether it is still ours.
# Needs $dir, the cluster's state and temp dir.

# pids of the live (not zombie) processes of session $1
session_pids() { ps -eo pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ {print $1}'; }

# is session $1 still a Ray node of ours? Only if its processes name our temp dir
# (session ids get reused).
ours() {
  local pid
  for pid in $(session_pids "$1"); do
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/"; then return 0; fi
  done
  return 1
}
