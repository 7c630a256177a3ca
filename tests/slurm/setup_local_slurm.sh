#!/usr/bin/env bash
# A one-node SLURM cluster on localhost for the integration tests (Debian packages, no systemd, no slurmdbd).
#
#   tests/slurm/setup_local_slurm.sh install          apt-get install slurm-wlm + munge if missing
#   tests/slurm/setup_local_slurm.sh start DIR        write DIR/slurm.conf, start munged/slurmctld/slurmd
#   tests/slurm/setup_local_slurm.sh stop DIR         stop what `start` started (by recorded PID)
#
# The cluster is "configless": slurmctld reads DIR/slurm.conf, slurmd fetches it from slurmctld and caches it
# under /run/slurm/conf, where every client (sbatch, squeue, srun inside jobs) looks when there is no
# /etc/slurm/slurm.conf. SLURM_CONF would not do: the snakemake executor drops SLURM_* variables before the
# job's own srun. A machine that has /etc/slurm/slurm.conf (a real SLURM) is left alone (exit 77).
# Exit code 77 means "this machine cannot host a test cluster" (not root, no apt-get); the reason is printed.
# No accounting storage: job status comes from squeue (the test passes `--slurm-status-command squeue`);
# finished jobs are recorded in DIR/jobcomp.log (jobcomp/filetxt) so a test can check what ran through SLURM.
# Ports default to 6817/6818; set XMR_SLURMCTLD_PORT / XMR_SLURMD_PORT to run beside another cluster.
set -euo pipefail

cmd=${1:-}
cannot_host() { echo "cannot host a local SLURM cluster: $*" >&2; exit 77; }

install_packages() {
    if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || cannot_host "not root (apt-get install slurm-wlm munge needs root)"
    command -v apt-get >/dev/null || cannot_host "no apt-get on this machine"
    export DEBIAN_FRONTEND=noninteractive
    # a fresh machine has no package lists yet
    if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1; then
        apt-get update -q >/dev/null || cannot_host "apt-get update failed (no package mirror reachable)"
        apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
            || cannot_host "apt-get install slurm-wlm munge failed"
    fi
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start() {
    local dir=$1
    [ "$(id -u)" = 0 ] || cannot_host "not root (slurmd must run as root)"
    [ -e /etc/slurm/slurm.conf ] && cannot_host "/etc/slurm/slurm.conf exists (a real SLURM install; not touching it)"
    install_packages
    mkdir -p "$dir"/ctld "$dir"/slurmd "$dir"/log
    dir=$(cd "$dir" && pwd)

    # munge: reuse a running munged (another test or the host's), else start one and own it
    if ! munge_ok; then
        [ -f /etc/munge/munge.key ] || { /usr/sbin/mungekey -c >/dev/null 2>&1 || cannot_host "no munge key"; }
        chown munge:munge /etc/munge/munge.key 2>/dev/null || true
        mkdir -p /run/munge /var/lib/munge /var/log/munge
        chown munge:munge /run/munge /var/lib/munge /var/log/munge
        rm -f /run/munge/munged.pid
        setsid runuser -u munge -- /usr/sbin/munged -F --force </dev/null >"$dir/log/munged.out" 2>&1 &
        for _ in $(seq 50); do munge_ok && break; sleep 0.2; done
        munge_ok || { cat "$dir/log/munged.out" >&2; echo "munged did not start" >&2; exit 1; }
        # record munged's own PID (runuser is its parent and exits when munged does)
        cp /run/munge/munged.pid "$dir/munged.pid"
    fi

    local host cpus mem_mb
    host=$(hostname -s)
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS (pytest-xdist workers set it to 1)
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
    cat >"$dir/slurm.conf" <<EOF
# xmr test cluster (tests/slurm/setup_local_slurm.sh)
ClusterName=xmrtest
SlurmctldParameters=enable_configless
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${XMR_SLURMCTLD_PORT:-6817}
SlurmdPort=${XMR_SLURMD_PORT:-6818}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd.pidfile
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
MinJobAge=600
DefMemPerCPU=500
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    setsid /usr/sbin/slurmctld -D -i -f "$dir/slurm.conf" </dev/null >"$dir/log/slurmctld.out" 2>&1 &
    echo $! >"$dir/slurmctld.pid"
    for _ in $(seq 50); do SLURM_CONF=$dir/slurm.conf scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
    rm -rf /run/slurm/conf  # a stale cache of an earlier test cluster
    setsid /usr/sbin/slurmd -D --conf-server "127.0.0.1:${XMR_SLURMCTLD_PORT:-6817}" \
        </dev/null >"$dir/log/slurmd.out" 2>&1 &
    echo $! >"$dir/slurmd.pid"
    for _ in $(seq 150); do
        state=$(sinfo -h -o %t 2>/dev/null || true)
        [ "$state" = idle ] && { echo "local SLURM cluster up ($dir/slurm.conf, cached in /run/slurm/conf)"; return 0; }
        sleep 0.2
    done
    echo "slurm node never became idle (state: ${state:-none}); logs:" >&2
    tail -n 20 "$dir"/log/*.log "$dir"/log/*.out >&2 || true
    stop "$dir"
    exit 1
}

stop() {
    local dir=$1 pid
    for name in slurmd slurmctld munged; do
        [ -f "$dir/$name.pid" ] || continue
        pid=$(cat "$dir/$name.pid")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/$name.pid"
    done
    # slurmd's config cache link, when it is ours
    if [ -L /run/slurm/conf ] && [ -e /run/slurm/conf/slurm.conf ] \
        && grep -q "xmr test cluster" /run/slurm/conf/slurm.conf; then
        rm -f /run/slurm/conf
    fi
}

case "$cmd" in
    install) install_packages ;;
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop "${2:?usage: $0 stop DIR}" ;;
    *) echo "usage: $0 {install|start DIR|stop DIR}" >&2; exit 2 ;;
esac
