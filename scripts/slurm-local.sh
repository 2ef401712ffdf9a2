#!/usr/bin/env bash
# A single-node SLURM on this machine, to run workflow/profiles/slurm for real (docs/cluster.md).
#
#   scripts/slurm-local.sh up       install slurm-wlm and munge if missing, then start munged, slurmctld and slurmd
#   scripts/slurm-local.sh status   what runs, and the partitions
#   scripts/slurm-local.sh down     stop what `up` started
#
# Everything lives in one folder this script owns, $SPECFIT_SLURM_DIR (default /tmp/specfit-slurm): slurm.conf,
# munge's key and socket, state, pid and log files. Nothing under /etc changes beyond what the packages install.
# Two partitions, named as in the profile: `cpu` (default) and `gpu` (the same node, no GPU: it stands in for a site's
# GPU partition, so CUDA devices' jobs cannot run here). Ports: $SPECFIT_SLURM_PORTS (default 6817,6818), refused
# when something else listens on them. Accounting is off: Snakemake polls with `--slurm-status-command squeue`,
# which works because finished jobs stay visible to squeue for MinJobAge (an hour).
set -euo pipefail

dir=${SPECFIT_SLURM_DIR:-/tmp/specfit-slurm}
ports=${SPECFIT_SLURM_PORTS:-6817,6818}
ctld_port=${ports%%,*}
slurmd_port=${ports##*,}
conf=$dir/slurm.conf
socket=$dir/munge/munge.socket.2
node=$(hostname -s)

die() { echo "slurm-local: $*" >&2; exit 1; }

# pid of a daemon this script started, if it still runs
running() {
    local pidfile=$dir/run/$1.pid pid
    [[ -s $pidfile ]] || return 1
    pid=$(<"$pidfile")
    kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install_packages() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null && return
    echo "slurm-local: installing slurm-wlm and munge" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null; }
}

# TCP ports in LISTEN state (from /proc: no ss or netstat needed)
listening() {
    local port hex
    for port in "$@"; do
        hex=$(printf ':%04X' "$port")
        if awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
            echo "$port"
        fi
    done
}

node_mem_mb() {  # the node's RealMemory: this machine's (or its cgroup's) memory, less a tenth for the OS
    local mem_mb limit
    mem_mb=$(awk '/^MemTotal/ { print int($2 / 1024) }' /proc/meminfo)
    limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo max)
    if [[ $limit =~ ^[0-9]+$ ]] && (( limit / 1048576 < mem_mb )); then mem_mb=$(( limit / 1048576 )); fi
    echo $(( mem_mb * 9 / 10 ))
}

write_conf() {
    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(node_mem_mb)
    cat > "$conf" <<EOF
# Written by scripts/slurm-local.sh: a single-node SLURM in $dir.
ClusterName=specfit-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state/ctld
SlurmdSpoolDir=$dir/state/slurmd
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# a container: no cgroups, no systemd. Memory is still enforced as on a site: slurmd reads each step's RSS from
# /proc every second and kills a step over its job's request (OverMemoryKill).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
SchedulerParameters=sched_interval=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=cpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$node Default=NO MaxTime=INFINITE State=UP
EOF
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq "$seconds"); do
        "$@" >/dev/null 2>&1 && return
        sleep 1
    done
    die "$what did not come up within ${seconds}s; see $dir/log/"
}

node_idle() {
    SLURM_CONF=$conf sinfo -h -n "$node" -o %T | grep -qE '^(idle|mixed|allocated)'
}

up() {
    install_packages
    if [[ -z $(running slurmctld) && -z $(running slurmd) ]]; then
        local taken
        taken=$(listening "$ctld_port" "$slurmd_port" | paste -sd, -)
        if [[ -n $taken ]]; then
            command -v ss >/dev/null && ss -ltnp | grep -E ":(${ctld_port}|${slurmd_port})\\b" >&2
            die "port(s) $taken already in use by another program (set SPECFIT_SLURM_PORTS=ctld,slurmd to others)"
        fi
    fi
    mkdir -p "$dir"/{munge,state/ctld,state/slurmd,run,log}
    chmod 700 "$dir/munge"
    if [[ -z $(running munged) ]]; then
        [[ -s $dir/munge/munge.key ]] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; }
        chmod 600 "$dir/munge/munge.key"
        munged --force --key-file="$dir/munge/munge.key" --socket="$socket" --pid-file="$dir/run/munged.pid" \
            --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed"
        wait_for 10 munged munge --socket="$socket" -n
    fi
    # a fresh start takes this script's config (a running slurmctld keeps the one it read)
    [[ -n $(running slurmctld) && -s $conf ]] || write_conf
    # Inside a job, the Snakemake SLURM plugins drop every SLURM_* variable before their `srun` (SLURM_CONF included;
    # snakemake-executor-plugin-slurm#164): a site's clients find /etc/slurm, ours find it through this `srun`.
    mkdir -p "$dir/bin"
    printf '#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' "$conf" "$(command -v srun)" > "$dir/bin/srun"
    chmod +x "$dir/bin/srun"
    if [[ -z $(running slurmctld) ]]; then
        SLURM_CONF=$conf slurmctld -f "$conf"
        wait_for 30 slurmctld env SLURM_CONF="$conf" scontrol ping
    fi
    if [[ -z $(running slurmd) ]]; then
        SLURM_CONF=$conf slurmd -f "$conf" -N "$node"
    fi
    wait_for 60 "node $node" node_idle
    status >&2
    # what a shell needs (eval "$(scripts/slurm-local.sh up)"): the config, and one core's share of the node (1 CPU,
    # the node's memory over its cores) as the cluster profile's caps on each job's request (workflow/profiles/slurm)
    echo "export SLURM_CONF=$conf PATH=$dir/bin:\$PATH"
    echo "export SPECFIT_SLURM_MAX_CPUS=1 SPECFIT_SLURM_MAX_MEM_MB=$(( $(node_mem_mb) / $(nproc) ))"
}

down() {
    local name pid
    if [[ -n $(running slurmctld) && -n $(running slurmd) ]]; then  # end the jobs first: their steps outlive slurmd
        SLURM_CONF=$conf scancel --full --quiet --user="$(id -un)" || true
        for _ in $(seq 60); do
            [[ -z $(SLURM_CONF=$conf squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2>/dev/null) ]] && break
            sleep 1
        done
    fi
    for name in slurmd slurmctld munged; do
        pid=$(running "$name") || continue
        kill "$pid"
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        rm -f "$dir/run/$name.pid"
        echo "slurm-local: stopped $name ($pid)"
    done
    return 0
}

status() {
    local name pid
    for name in munged slurmctld slurmd; do
        if pid=$(running "$name"); then echo "$name: running ($pid)"; else echo "$name: stopped"; fi
    done
    if [[ -n $(running slurmctld) ]]; then SLURM_CONF=$conf sinfo; fi
}

case ${1:-} in
    up) up ;;
    down) down ;;
    status) status ;;
    *) die "usage: $0 up|down|status" ;;
esac
