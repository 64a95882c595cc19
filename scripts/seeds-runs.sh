#!/usr/bin/env bash
# The four runs the seeds' scorecard reads, into one directory, and its scorecard there (issue 22,
# item 5: do the scorecard's directions hold on a busy machine?):
#   scripts/seeds-runs.sh DIR [busy-loops=0] [extra bench flags...]
# With BUSY-LOOPS > 0 that many shell busy loops run beside the benchmark (as
# scripts/test-under-load.sh) and stop however it ends. Each run's command is the one
# docs/benchmark-seeds.md gives for the committed results; `npm run bench -- seeds --dir DIR
# --no-doc` then scores them without touching the committed scorecard. Compare directories with
# `npm run bench -- seeds-spread --dirs A,B,... [--labels a,b,...]`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/seeds-runs.sh DIR [busy-loops] [bench flags...]}
loops=${2:-0}
shift $(($# < 2 ? $# : 2))
extra=("$@")
mkdir -p "$dir"
export WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false
# shellcheck source=busy-loops.sh
. scripts/busy-loops.sh
start_busy_loops "$loops"
run() {
  local name=$1
  shift
  local start=$SECONDS
  node bench/run.mjs "$@" ${extra[@]+"${extra[@]}"} --json "$dir/$name.json" >"$dir/$name.log" 2>&1
  echo "$name: $((SECONDS - start)) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
}
run multiturn multiturn
run agentic agentic
run agentic-ablation agentic --requests 200 --time-scale 0.1 --config pd-4p4d/cache_aware,pd-6p2d/cache_aware,pd-6p2d/fire-and-forget
run agentic-breakdown agentic --requests 50 --time-scale 0.2 --config pd-6p2d/cache_aware
node bench/run.mjs seeds --dir "$dir" --no-doc --json "$dir/seeds.json" >"$dir/seeds.log" 2>&1
grep -m1 -o "[0-9]* of 25 comparisons.*effect size" "$dir/seeds.log"
