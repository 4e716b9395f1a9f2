#!/usr/bin/env bash
# Session 26, device call 1: session 25's D=256 two-warpgroup planner change applied (the planner
# now picks w8q1kv64g, two warpgroups of 64 rows, one CTA per SM, for head dim 256 over ragged
# K/V on sm_90a). First the full verify; then every f16 D=256 shape of the prefill list, seq 512
# to 16384, planned (w8q1kv64g) against the tile planned before (`--tile w4q1kv64b1g`), in the
# order A B B A (.device/d256-f16.json: bench/shapes.json's 27 f16 D=256 prefill shapes), to find any crossover below seq 4096. bench checks every result first.
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin/attnforge
T0=$(date +%s)
timeout 240 $B verify --backend cuda --suite full > $OUT/verify-full.log 2>&1
echo "verify exit $? ($(( $(date +%s) - T0 )) s)"; tail -3 $OUT/verify-full.log
grep -iE "fail|mismatch" $OUT/verify-full.log | head -20
t0=$(date +%s)
i=0
for t in w4q1kv64b1g planned planned w4q1kv64b1g; do
  i=$((i+1))
  if [ "$t" = planned ]; then a=(); else a=(--tile "$t"); fi
  echo "== tile $t"
  timeout 130 $B bench --all --shapes .device/d256-f16.json --json-out $OUT/cross-$i-$t.jsonl "${a[@]}" 2>&1 | grep -E "d256|error|Error"
done | tee $OUT/d256-crossover.txt
echo "crossover ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
