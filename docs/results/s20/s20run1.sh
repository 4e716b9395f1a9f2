#!/usr/bin/env bash
# Session 20, device call 1: session 19's kept changes, neither on main: (a) whole-sub-piece.patch (f16-QK wgmma kernels
# widen a masked or soft-capped sub-tile whole (whole-sub-piece.patch) against main's build
# (uniform descriptors), quick verify and ABBA; (b) the helper's spill branch (spills-branch.mbox on
# main 3efbabb, Q_DESC_IN_LOOP without sinks, its Q base warp-uniform): quick and full verify, ABBA on headline shapes (its changed kernels,
# custom/ALiBi/window/custom-mask D=128, have no bench shape).
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
for v in piece; do
  timeout 60 $B/attnforge-$v verify --backend cuda --suite quick --seed 2001 > $OUT/verify-quick-$v.log 2>&1; echo "verify quick $v exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-$v.log)"
  grep -E "^FAIL" $OUT/verify-quick-$v.log | head -5
done
timeout 150 $B/attnforge-spills verify --backend cuda --suite full --seed 2002 > $OUT/verify-full-spills.log 2>&1; echo "verify full spills exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-spills.log)"
grep -E "^FAIL" $OUT/verify-full-spills.log | head -8
t0=$(date +%s)
timeout 60 python3 bench/ab.py --bin shfl=$B/attnforge-shfl --bin piece=$B/attnforge-piece \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk \
 --shape f16-d128-h32/8-s8192-causal-softcap50-f16qk --shape f16-d128-h32/32-s4096-noncausal-f16qk \
 --rounds 1 --out $OUT/ab-piece.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-piece.txt; echo "ab piece ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 50 python3 bench/ab.py --bin shfl=$B/attnforge-shfl --bin spills=$B/attnforge-spills \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --rounds 1 --out $OUT/ab-spills.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-spills.txt; echo "ab spills ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
