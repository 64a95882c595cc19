# Sourced by the scripts that run something beside busy loops (test-under-load.sh, seeds-runs.sh):
# `start_busy_loops N` starts N shell busy loops in this session (they share the CPU scheduler's
# group with what runs beside them, the worst case) and stops them however the script ends.
busy_pids=()
stop_busy_loops() { for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null; done; }
start_busy_loops() {
  trap stop_busy_loops EXIT
  for _ in $(seq "$1"); do
    (while :; do :; done) &
    busy_pids+=($!)
  done
}
