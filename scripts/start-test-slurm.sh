#!/usr/bin/env bash
# A single-node Slurm on 127.0.0.1 for the distributed tests (tests/e2e/slurm.rs), with four fake GPUs
# (character devices listed in gres.conf: srun/sbatch --gres=gpu:N set CUDA_VISIBLE_DEVICES).
# Idempotent: installs slurm-wlm and munge if missing, (re)writes the config, starts munged,
# slurmctld and slurmd if they are not running, and waits until the node is idle.
#   bash scripts/start-test-slurm.sh          # start (or check) it
#   bash scripts/start-test-slurm.sh stop     # stop the daemons it started
set -euo pipefail
ROOT=/var/lib/miles-test-slurm
CONF_DIR=/etc/slurm
NODE=$(hostname -s)

if [ "${1:-}" = stop ]; then
    for d in slurmd slurmctld; do
        [ -f "$ROOT/$d.pid" ] && kill "$(cat "$ROOT/$d.pid")" 2>/dev/null || true
    done
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "start-test-slurm.sh: needs root (apt-get, daemons)" >&2
    exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
fi

mkdir -p "$ROOT"/{state,spool,log,fakedev} "$CONF_DIR" /run/munge /var/log/munge /var/lib/munge /etc/munge
for i in 0 1 2 3; do
    [ -e "$ROOT/fakedev/nvidia$i" ] || mknod "$ROOT/fakedev/nvidia$i" c 195 "$i"
done

# At least 4 CPUs even on a 2-core machine (slurmd is told to trust this file, not the hardware):
# a data-parallel run's two trainer ranks and its engine are three one-CPU steps
# (tests/e2e/ddp.rs). The CPUs are oversubscribed, as every worker here shares the same cores.
CPUS=$(( $(nproc) < 4 ? 4 : $(nproc) ))
cat > "$CONF_DIR/slurm.conf.new" <<CONF
ClusterName=miles-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
SlurmdParameters=config_overrides
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
SlurmctldPidFile=$ROOT/slurmctld.pid
SlurmdPidFile=$ROOT/slurmd.pid
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
cat > "$CONF_DIR/gres.conf.new" <<CONF
NodeName=$NODE Name=gpu File=$ROOT/fakedev/nvidia[0-3]
CONF
changed=0
for f in slurm.conf gres.conf; do
    if ! cmp -s "$CONF_DIR/$f.new" "$CONF_DIR/$f"; then
        mv "$CONF_DIR/$f.new" "$CONF_DIR/$f"
        changed=1
    else
        rm -f "$CONF_DIR/$f.new"
    fi
done

if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    if id munge >/dev/null 2>&1; then
        su -s /bin/sh munge -c munged 2>/dev/null || munged --force
    else
        munged --force
    fi
fi

running() { [ -f "$ROOT/$1.pid" ] && kill -0 "$(cat "$ROOT/$1.pid")" 2>/dev/null; }
if [ "$changed" = 1 ]; then
    for d in slurmd slurmctld; do running "$d" && kill "$(cat "$ROOT/$d.pid")" && sleep 0.5 || true; done
fi
running slurmctld || slurmctld
running slurmd || slurmd

# Wait (bounded) for the node to come up idle.
for _ in $(seq 1 100); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -n1 || true)
    case "$state" in
        idle|mix|alloc) echo "test Slurm up: node $NODE ($state), 4 fake GPUs"; exit 0 ;;
        down*|drain*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.1
done
echo "start-test-slurm.sh: the node did not come up; see $ROOT/log/" >&2
exit 1
