#!/usr/bin/env bash
# npm test with busy loops beside it, as the suite must hold on a loaded machine (issue 25):
#   scripts/test-under-load.sh [loops=4] [runs=1]
# Starts LOOPS shell busy loops in this session (so they share the CPU scheduler's group with the
# suite, the worst case), runs `npm test` RUNS times in a row, prints each run's wall time and
# result, and stops the loops however it ends. Exit status: 1 if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
loops=${1:-4}
runs=${2:-1}
export WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false
# shellcheck source=busy-loops.sh
. scripts/busy-loops.sh
start_busy_loops "$loops"
failed=0
for run in $(seq "$runs"); do
  start=$(date +%s)
  if npm test >"/tmp/test-under-load-$run.log" 2>&1; then result=passed; else result=FAILED; failed=1; fi
  end=$(date +%s)
  summary=$(grep -E "Test Files|Tests  " "/tmp/test-under-load-$run.log" | sed 's/\x1b\[[0-9;]*m//g' | tr -s ' ' | paste -sd ';')
  echo "run $run of $runs with $loops busy loops: $result in $(((end - start) / 60))m$(((end - start) % 60))s ($summary; load average $(cut -d' ' -f1-3 /proc/loadavg)); log /tmp/test-under-load-$run.log"
done
exit $failed
