#!/usr/bin/env bash
# A single-node SLURM on this machine, for the tests and for trying `sweeps slurm`.
#
#   cluster/slurm/local-slurm.sh start    install (if missing) and start munged, slurmctld, slurmd
#   cluster/slurm/local-slurm.sh status   what runs, and sinfo
#   cluster/slurm/local-slurm.sh stop     cancel the local jobs, stop only what `start` started
#
# Needs root (it installs Debian's slurmctld, slurmd, slurm-client and munge with apt-get when
# they are missing, and runs the daemons as root). Idempotent: `start` twice is fine.
# Config, state, logs and the PIDs it started live in $SWEEPS_SLURM_DIR (/tmp/sweeps-slurm).
# Client commands find the config through SLURM_CONF=$SWEEPS_SLURM_DIR/slurm.conf; when the
# machine has no /etc/slurm/slurm.conf, `start` links it there so plain sbatch/squeue work too.
set -euo pipefail

DIR=${SWEEPS_SLURM_DIR:-/tmp/sweeps-slurm}
PARTITION=${SWEEPS_SLURM_PARTITION:-local}
CTLD_PORT=${SWEEPS_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${SWEEPS_SLURM_SLURMD_PORT:-6818}
CONF=$DIR/slurm.conf
SYSTEM_CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
export SLURM_CONF=$CONF

say() { echo "local-slurm: $*" >&2; }
die() { say "$*"; exit 1; }

alive() {  # alive NAME: the PID recorded for NAME runs, and is that program
    local pid
    pid=$(cat "$DIR/pids/$1" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && grep -q "$1" "/proc/$pid/cmdline" 2>/dev/null
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    [[ $(id -u) -eq 0 ]] || die "SLURM is not installed and installing it needs root"
    command -v apt-get >/dev/null || die "SLURM is not installed and there is no apt-get"
    say "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq slurmctld slurmd slurm-client munge; } \
        >"$DIR/log/apt.log" 2>&1; then
        die "apt-get install failed; see $DIR/log/apt.log"
    fi
}

write_config() {
    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.95)}' /proc/meminfo)
    cat >"$CONF.tmp" <<EOF
# Written by cluster/slurm/local-slurm.sh: one node ($NODE), partition $PARTITION.
ClusterName=sweeps-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged runs already (ours or the system's)
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            /usr/sbin/create-munge-key -f
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid \
        || die "munged did not start; see /var/log/munge/munged.log"
    cp /run/munge/munged.pid "$DIR/pids/munged"
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "munged runs but does not answer"
}

start_daemon() {  # start_daemon NAME: run it in the foreground (-D), detached, record its PID
    local name=$1
    alive "$name" && return 0
    setsid "/usr/sbin/$name" -D -f "$CONF" >>"$DIR/log/$name.out" 2>&1 </dev/null &
    echo $! >"$DIR/pids/$name"
}

wait_idle() {
    local state=""
    for _ in $(seq 150); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1) || true
        case $state in
            idle* | mixed* | allocated* | completing*) return 0 ;;
            down* | drain*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.2
    done
    die "node $NODE did not come up (state '${state}'); see $DIR/log/slurmctld.log, slurmd.log"
}

link_config() {
    if [[ ! -e $SYSTEM_CONF && ! -L $SYSTEM_CONF ]]; then
        mkdir -p "$(dirname "$SYSTEM_CONF")"
        ln -s "$CONF" "$SYSTEM_CONF"
    elif [[ $(readlink "$SYSTEM_CONF" || true) != "$CONF" ]]; then
        say "$SYSTEM_CONF belongs to another SLURM: export SLURM_CONF=$CONF to use this one"
    fi
}

cmd_start() {
    mkdir -p "$DIR"/{state,spool,run,log,pids}
    install_packages
    if ! alive slurmctld; then
        write_config
    fi
    start_munge
    start_daemon slurmctld
    start_daemon slurmd
    link_config
    wait_idle
    say "up: partition '$PARTITION' on $NODE ($(nproc) CPUs); SLURM_CONF=$CONF"
}

cmd_stop() {
    if alive slurmctld; then
        scancel --partition="$PARTITION" >/dev/null 2>&1 || true
        sleep 1
    fi
    local name pid
    for name in slurmd slurmctld munged; do
        alive "$name" || { rm -f "$DIR/pids/$name"; continue; }
        pid=$(cat "$DIR/pids/$name")
        kill -TERM "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        rm -f "$DIR/pids/$name"
        say "stopped $name ($pid)"
    done
    if [[ -L $SYSTEM_CONF && $(readlink "$SYSTEM_CONF") == "$CONF" ]]; then
        rm -f "$SYSTEM_CONF"
    fi
}

cmd_status() {
    local name rc=0
    for name in munged slurmctld slurmd; do
        if alive "$name"; then
            echo "$name: running (pid $(cat "$DIR/pids/$name"))"
        else
            echo "$name: not started by this script"
            [[ $name == munged ]] || rc=1
        fi
    done
    [[ $rc -eq 0 ]] && sinfo
    return $rc
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
