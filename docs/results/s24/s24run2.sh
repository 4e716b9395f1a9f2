#!/usr/bin/env bash
# Session 24, device call 2: F16_WARP_CHOICE (the f16-QK wgmma kernels whose sub-tile is computed
# whole pack the float path's P into the accumulators, so both paths meet before one P V and the
# path is chosen per warp, without the warpgroup barrier per sub-tile). The f16-QK cases of the
# full verify first (the kernels that change), then ABBA against main's binary on the f16-QK
# shapes (soft-cap too: its kernels always take the float path) and their f32-QK twins
# (unchanged kernels: the controls, and the figure f16 QK is judged against), then the whole full
# verify.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 150 $B/attnforge verify --backend cuda --suite full --seed 2403 --filter qk16 > $OUT/verify-qk16.log 2>&1
echo "verify full qk16 exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-qk16.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-qk16.log | head -12
t0=$(date +%s)
timeout 300 python3 bench/ab.py --bin main=$B/attnforge-main --bin s24=$B/attnforge \
  --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal \
  --shape f16-d128-h32/32-s4096-noncausal-f16qk --shape f16-d128-h32/32-s4096-noncausal \
  --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d128-h32/8-s8192-causal \
  --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk --shape f16-d128-h32/32-s4096-causal-softcap50 \
  --shape f16-d64-h32/32-s4096-causal-f16qk \
  --rounds 1 --out $OUT/ab.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab.txt
echo "ab ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 200 $B/attnforge verify --backend cuda --suite full --seed 2404 > $OUT/verify-full.log 2>&1
echo "verify full exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-full.log | head -12
echo "total $(( $(date +%s) - T0 )) s"
