#!/usr/bin/env bash
# Tear down the cluster started by scripts/slurm_up.sh. Idempotent (a second call is a no-op).
#
# Stops only daemons found through their pid files, and munged/MariaDB only if slurm_up.sh
# started them (marker files), so a machine's own services are left alone.
#   slurm_down.sh           stop everything; keep state, so job ids keep increasing
#   slurm_down.sh --purge   also drop the accounting DB, $SLURM_BASE and the generated configs.
#                           Job ids then restart at 1; dropping the DB too keeps stale sacct rows
#                           from matching new ids (submitit would read the old job's state).
set -uo pipefail

SLURM_BASE=${SLURM_BASE:-/tmp/slurm}
PURGE=0; [ "${1:-}" = "--purge" ] && PURGE=1
T_START=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T_START) / 1000000 )); printf '[slurm_down %4d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }

# alive PIDFILE COMM (scripts/slurm_lib.sh)
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
stop_pidfile() {  # stop_pidfile PIDFILE COMM
  if alive "$1" "$2"; then
    local pid; pid=$(cat "$1"); log "stopping $2 (pid $pid)"; kill -TERM "$pid"
    for _ in $(seq 1 60); do alive "$1" "$2" || { rm -f "$1"; return 0; }; sleep 0.25; done
    log "$2 ignored SIGTERM, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
  else
    log "$2 not running"
  fi
  rm -f "$1"
}

# 1. cancel all jobs and wait for them to leave the queue: slurmd does not kill running jobs
#    when it shuts down, they would be orphaned
if alive "$SLURM_BASE/slurmctld.pid" slurmctld && scontrol ping 2>/dev/null | grep -q UP; then
  jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 80); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.25; done
  fi
fi
stepds() { ps -eo pid=,comm= | awk '$2=="slurmstepd"{print $1}' | tr '\n' ' '; }
for _ in $(seq 1 60); do [ -z "$(stepds | tr -d ' ')" ] && break; sleep 0.25; done

# 2. slurm daemons (slurmd first so that it does not complain about a missing controller)
stop_pidfile "$SLURM_BASE/slurmd.pid" slurmd
stop_pidfile "$SLURM_BASE/slurmctld.pid" slurmctld
stop_pidfile "$SLURM_BASE/slurmdbd.pid" slurmdbd
left=$(stepds)
[ -n "${left// /}" ] && log "WARNING: slurmstepd still running (pids $left)"

# 3. MariaDB / munged, only if slurm_up.sh started them
if [ "$PURGE" = 1 ] && command -v mysqladmin >/dev/null && mysqladmin ping >/dev/null 2>&1; then
  log "dropping slurm_acct_db"
  mysql -e "DROP DATABASE IF EXISTS slurm_acct_db; DROP USER IF EXISTS 'slurm'@'localhost';"
fi
if [ -e "$SLURM_BASE/mariadb.started-by-slurm_up" ]; then
  if mysqladmin ping >/dev/null 2>&1; then
    log "stopping mariadb"; mysqladmin shutdown
  else
    log "mariadb not running"
  fi
  rm -f "$SLURM_BASE/mariadb.started-by-slurm_up"
fi
if [ -e "$SLURM_BASE/munged.started-by-slurm_up" ]; then
  stop_pidfile /run/munge/munged.pid munged
  rm -f "$SLURM_BASE/munged.started-by-slurm_up"
fi

if [ "$PURGE" = 1 ]; then
  log "purging $SLURM_BASE and generated configs"
  rm -rf "$SLURM_BASE" /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf
fi
log "down"
