# Shared by scripts/slurm_up.sh and scripts/slurm_down.sh (sourced, not run).

# alive PIDFILE COMM: true if the pid in PIDFILE is a live, non-zombie process named COMM.
# (Stopped daemons linger as zombies here because PID 1 reaps lazily, so `pgrep` would lie.)
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/status" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"
}
