#!/usr/bin/env bash
# Session 25, device call 2. Two candidates against the binary before each:
# - kfree (K_FREE_BEFORE_PV, on main's 0f1bb6a): the one-buffer f16-QK wgmma kernels (D=256) load
#   K_{t+1} during P V and V_t during S = Q K^T, as the f32-QK ones do. Verify: the full suite's
#   f16-QK cases; ABBA against main (2 rounds) on the D=256 f16-QK shapes, their f32 twins the
#   control.
# - sums (experiment, on kfree): the f16 f32-QK D=128 two-warpgroup kernels that take row sums by
#   MMA (unmasked, or paged) take f32 adds and the exponents after the rescale, as the bf16 ones
#   do. Verify: the full suite's f16 f32-QK D=128 cases; ABBA against kfree (2 rounds).
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
export ATTNFORGE_CACHE_DIR=/tmp/afcache-kfree
timeout 150 $B/attnforge-kfree verify --backend cuda --suite full --seed 2502 --filter qk16 > $OUT/verify-qk16-kfree.log 2>&1
echo "verify kfree qk16 exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-qk16-kfree.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-qk16-kfree.log | head -12
t0=$(date +%s)
export ATTNFORGE_CACHE_DIR=/tmp/afcache-sums
timeout 150 $B/attnforge-sums verify --backend cuda --suite full --seed 2503 --filter f16/qk32/d128 > $OUT/verify-sums.log 2>&1
echo "verify sums f16/qk32/d128 exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-sums.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-sums.log | head -12
unset ATTNFORGE_CACHE_DIR
t0=$(date +%s)
timeout 240 python3 bench/ab.py --bin main=$B/attnforge-main --bin kfree=$B/attnforge-kfree \
  --shape f16-d256-h32/32-s4096-causal-f16qk --shape f16-d256-h32/32-s4096-noncausal-f16qk \
  --shape f16-d256-h32/32-s4096-causal --shape f16-d256-h32/32-s4096-noncausal \
  --rounds 2 --out $OUT/ab-kfree.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-kfree.txt
echo "ab kfree exit ${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 300 python3 bench/ab.py --bin kfree=$B/attnforge-kfree --bin sums=$B/attnforge-sums \
  --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s1024-noncausal \
  --shape f16-d128-h32/8-s8192-noncausal --shape f16-d128-h32/32-s16384-noncausal \
  --shape f16-d128-h32/32-ragged16-noncausal \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-noncausal \
  --shape f16-d128-h32/32-s4096-causal --shape bf16-d128-h32/32-s4096-noncausal \
  --rounds 2 --out $OUT/ab-sums.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-sums.txt
echo "ab sums exit ${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
