#!/usr/bin/env bash
# Session 25, device call 5 (the budget's last 260 s): main (0d9e97f's kernels = 215cb94) on the
# D=256 s4096 shapes with the planner's tile (w4q1kv64b1g: one warpgroup of 64 rows, one K/V
# buffer, two CTAs per SM) and with `--tile w8q1kv64g` (two warpgroups of 64 rows, two K/V buffers
# by TMA, one CTA per SM: 234 registers, no spill, compiled here), in the order A B B A. bench
# checks every result against the reference before timing it.
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin/attnforge
T0=$(date +%s)
for t in planned w8q1kv64g w8q1kv64g planned; do
  if [ "$t" = planned ]; then a=(); else a=(--tile "$t"); fi
  echo "== tile $t"
  timeout 60 $B bench --all --filter f16-d256-h32/32-s4096 "${a[@]}" 2>&1 | tail -7
done | tee $OUT/d256-two-warpgroups.txt
echo "total $(( $(date +%s) - T0 )) s"
