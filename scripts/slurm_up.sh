#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on this machine (Debian 12, root, no systemd) so that
# `qrl-bench -m hydra/launcher=slurm ...` and tests/integration/test_slurm.py have a real scheduler.
#
# Idempotent: safe to run again; it installs/starts only what is missing and restarts
# slurmctld/slurmd only when the generated slurm.conf changed. Tear down with scripts/slurm_down.sh.
#
# Why each piece (details: shared/infra-notes.md section 2):
#   munge      SLURM's authentication; without systemd /run/munge must be created by hand.
#   slurmdbd   + MariaDB accounting: without it `sacct` fails, and submitit waits FOREVER for a job
#              that died without writing its result (scancel, OOM kill, time limit).
#   no cgroups the cgroup plugins fail on this kind of machine; proctrack/linuxproc + task/none work.
#
# Env knobs:
#   SLURM_BASE=/tmp/slurm       state, spool, pid and log files
#   SLURM_ACCOUNTING=1          1: MariaDB + slurmdbd (sacct works); 0: no accounting
#   SLURM_PARTITION=debug       name of the (default) partition
#   SLURM_CLUSTER=ci            ClusterName
#   SLURM_CRED_EXPIRE=20        job credential lifetime (s); also how long a requeued job waits to restart
set -euo pipefail

SLURM_BASE=${SLURM_BASE:-/tmp/slurm}
SLURM_ACCOUNTING=${SLURM_ACCOUNTING:-1}
SLURM_PARTITION=${SLURM_PARTITION:-debug}
SLURM_CLUSTER=${SLURM_CLUSTER:-ci}
SLURM_CRED_EXPIRE=${SLURM_CRED_EXPIRE:-20}
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
T_START=$(date +%s%N)

log() { local ms=$(( ($(date +%s%N) - T_START) / 1000000 )); printf '[slurm_up %4d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
die() {
  log "ERROR: $*"
  for f in "$SLURM_BASE"/log/*.log; do [ -f "$f" ] && { echo "--- tail $f"; tail -n 20 "$f"; }; done
  exit 1
}

# alive PIDFILE COMM (scripts/slurm_lib.sh)
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
# wait_for SECONDS CMD...: poll CMD every 0.25 s until it succeeds
wait_for() {
  local n=$(( $1 * 4 )); shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  return 1
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
stop_pidfile() {  # stop_pidfile PIDFILE COMM
  if alive "$1" "$2"; then
    local pid; pid=$(cat "$1"); kill -TERM "$pid"
    for _ in $(seq 1 60); do alive "$1" "$2" || return 0; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

# ---------------------------------------------------------------- packages
PKGS=(slurmctld slurmd slurm-client munge)
[ "$SLURM_ACCOUNTING" = 1 ] && PKGS+=(slurmdbd mariadb-server)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  # no systemd: make sure the packages' maintainer scripts do not try to start services
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created_policy=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  log "packages installed"
else
  log "packages already installed"
fi

# Job ids continue from slurmctld's saved state; without it (first start, --purge, a reboot that emptied /tmp)
# they restart at 1, and the accounting DB (kept in MariaDB's own datadir) must start empty too, or sacct
# returns an old job's rows for a new job's id and submitit reads that job's state (slurm_down.sh --purge drops both)
FRESH_STATE=0; [ -e "$SLURM_BASE/state/job_state" ] || FRESH_STATE=1
mkdir -p "$SLURM_BASE"/{state,spool,log}

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating munge key"
  mungekey --create --keyfile=/etc/munge/munge.key --force
fi
chown munge:munge /etc/munge /etc/munge/munge.key
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "munged already running"
else
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1
  touch "$SLURM_BASE/munged.started-by-slurm_up"
  wait_for 10 bash -c 'munge -n | unmunge' || die "munged did not come up (see /var/log/munge/munged.log)"
fi

# ---------------------------------------------------------------- slurm.conf
NODE=$(hostname -s)
# `slurmd -C` prints the real hardware line; a RealMemory above the real value makes the node `inval`
HW=$(slurmd -C | head -n1 | sed -E 's/^NodeName=[^ ]+ //')
if [ "$SLURM_ACCOUNTING" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
# SlurmctldHost/NodeName must be `hostname -s`; the explicit 127.0.0.1 avoids relying on DNS.
# cred_expire: a requeued job (preemption -> submitit requeue) may not start again before the previous
# credential expires; the default 120 s only slows down resumes on this one-node cluster.
NEW_CONF=$(cat <<EOF
# generated by scripts/slurm_up.sh -- single-node cluster, no cgroups
ClusterName=$SLURM_CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=${SLURM_CRED_EXPIRE}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$ACCT
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
MailProg=/bin/true
StateSaveLocation=$SLURM_BASE/state
SlurmdSpoolDir=$SLURM_BASE/spool
SlurmctldPidFile=$SLURM_BASE/slurmctld.pid
SlurmdPidFile=$SLURM_BASE/slurmd.pid
SlurmctldLogFile=$SLURM_BASE/log/slurmctld.log
SlurmdLogFile=$SLURM_BASE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
NodeName=$NODE NodeAddr=127.0.0.1 $HW State=UNKNOWN
PartitionName=$SLURM_PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
conf_changed=0
if [ "$(cat "$CONF" 2>/dev/null)" != "$NEW_CONF" ]; then
  printf '%s\n' "$NEW_CONF" > "$CONF"; conf_changed=1
  log "wrote $CONF"
fi
if [ "$conf_changed" = 1 ] && { alive "$SLURM_BASE/slurmctld.pid" slurmctld || alive "$SLURM_BASE/slurmd.pid" slurmd; }; then
  log "config changed: restarting slurmctld/slurmd"
  stop_pidfile "$SLURM_BASE/slurmctld.pid" slurmctld
  stop_pidfile "$SLURM_BASE/slurmd.pid" slurmd
fi

# ---------------------------------------------------------------- accounting (optional)
if [ "$SLURM_ACCOUNTING" = 1 ]; then
  install -d -o mysql -g mysql -m 0755 /run/mysqld
  if mysqladmin ping >/dev/null 2>&1; then
    log "mariadb already running"
  else
    log "starting mariadb"
    setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
      </dev/null >>"$SLURM_BASE/log/mariadb.log" 2>&1 &
    touch "$SLURM_BASE/mariadb.started-by-slurm_up"
    wait_for 30 mysqladmin ping || die "mariadb did not come up"
  fi
  if [ "$FRESH_STATE" = 1 ] && ! alive "$SLURM_BASE/slurmdbd.pid" slurmdbd \
     && mysql -N -e "SHOW DATABASES LIKE 'slurm_acct_db'" | grep -q .; then
    log "no saved job state (job ids restart at 1): dropping the old accounting DB"
    mysql -e "DROP DATABASE slurm_acct_db"
  fi
  mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmci';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  NEW_DBD=$(cat <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$SLURM_BASE/log/slurmdbd.log
PidFile=$SLURM_BASE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmci
StorageLoc=slurm_acct_db
EOF
)
  if [ "$(cat "$DBD_CONF" 2>/dev/null)" != "$NEW_DBD" ]; then
    printf '%s\n' "$NEW_DBD" > "$DBD_CONF"
    stop_pidfile "$SLURM_BASE/slurmdbd.pid" slurmdbd
  fi
  chmod 600 "$DBD_CONF"   # slurmdbd refuses a group/world-readable slurmdbd.conf
  if alive "$SLURM_BASE/slurmdbd.pid" slurmdbd; then
    log "slurmdbd already running"
  else
    log "starting slurmdbd"
    slurmdbd </dev/null >/dev/null 2>&1
    wait_for 30 port_open 6819 || die "slurmdbd did not come up"
  fi
fi

# ---------------------------------------------------------------- slurmctld + slurmd
if alive "$SLURM_BASE/slurmctld.pid" slurmctld; then
  log "slurmctld already running"
else
  log "starting slurmctld"
  slurmctld </dev/null >/dev/null 2>&1
fi
wait_for 30 bash -c 'scontrol ping | grep -q UP' || die "slurmctld did not come up"

if alive "$SLURM_BASE/slurmd.pid" slurmd; then
  log "slurmd already running"
else
  log "starting slurmd"
  slurmd -N "$NODE" </dev/null >/dev/null 2>&1
fi

node_ok() { sinfo -h -n "$NODE" -o %t | grep -qE '^(idle|mix|alloc)'; }
if ! wait_for 30 node_ok; then
  # e.g. DOWN after an unclean stop, or DRAIN
  scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true
  wait_for 15 node_ok || die "node $NODE not usable: $(sinfo -h -N -o '%N %t %E')"
fi
if [ "$SLURM_ACCOUNTING" = 1 ]; then
  # slurmctld registers the cluster with slurmdbd by itself; wait until sacct answers
  wait_for 30 sacct -n -X -S now || die "sacct does not answer"
fi
log "cluster up: $(sinfo -h -o '%P %a %D %t %N') (accounting=$SLURM_ACCOUNTING)"
