#!/usr/bin/env bash
# Session 24, device call 4: F16_WARP_CHOICE again, two ABBA rounds: the paged f16-QK prefill (its
# kernels took the per-warp path too, not timed in call 2) beside its f32-QK twin (unchanged), and
# the ragged f16-QK shapes of call 2 with their f32 controls.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 400 python3 bench/ab.py --bin main=$B/attnforge-main --bin s24=$B/attnforge \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal-f16qk \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
  --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal \
  --shape f16-d128-h32/32-s4096-noncausal-f16qk --shape f16-d128-h32/32-s4096-noncausal \
  --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d128-h32/8-s8192-causal \
  --rounds 2 --out $OUT/ab.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab.txt
echo "ab ($(( $(date +%s) - T0 )) s)"
# Then the request's bounds in shared memory (BOUNDS_IN_SHARED, the helper's commit 2fbcbd5: only
# sm_80's 10 formerly spilling w4q2kv64 kernels change): the full verify planning sm_80's tiles,
# and ABBA with --tiles-of sm_80 (a proxy: those kernels compiled for sm_90a) on the two of them
# the shape list has, with an unchanged control.
t0=$(date +%s)
timeout 240 $B/attnforge verify --backend cuda --suite full --seed 2405 --tiles-of sm_80 > $OUT/verify-full-sm80.log 2>&1
echo "verify full sm80 tiles exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full-sm80.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-full-sm80.log | head -12
t0=$(date +%s)
timeout 150 python3 bench/ab.py --tiles-of sm_80 --bin main=$B/attnforge-main --bin s24=$B/attnforge \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal --shape bf16-d128-h32/32-s4096-causal \
  --shape f16-d128-h32/32-s4096-causal \
  --rounds 1 --out $OUT/ab-sm80.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-sm80.txt
echo "ab sm80 ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
