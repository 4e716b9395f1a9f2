#!/usr/bin/env bash
# Session 21, device call 1: f16 exponents for the f16-QK no-transform wgmma kernels (half) against
# main 306201d's kernels (main, same verify code): full verify of half (with the new widest-tile
# cases), the full verify planning sm_80's tiles (--tiles-of sm_80: the mma.sync kernels on the
# H200), then ABBA on the f16-QK shapes and the f32 controls.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 200 $B/attnforge verify --backend cuda --suite full --seed 2101 > $OUT/verify-full-half.log 2>&1; echo "verify full half exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-half.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-full-half.log | head -12
t0=$(date +%s)
timeout 140 python3 bench/ab.py --bin main=$B/attnforge-main --bin half=$B/attnforge \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-noncausal-f16qk \
 --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d64-h32/32-s4096-causal-f16qk \
 --shape f16-d256-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal \
 --shape f16-d128-h32/32-s4096-noncausal \
 --rounds 1 --out $OUT/ab-half.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-half.txt; echo "ab half ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 220 $B/attnforge verify --backend cuda --suite full --seed 2102 --tiles-of sm_80 > $OUT/verify-full-sm80.log 2>&1; echo "verify full sm80 tiles exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full-sm80.log)"
head -1 $OUT/verify-full-sm80.log
grep -E "^FAIL|^error|^stopped" $OUT/verify-full-sm80.log | head -12
echo "total $(( $(date +%s) - T0 )) s"
