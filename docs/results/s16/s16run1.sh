#!/usr/bin/env bash
# Session 16, device call 1. new = main 4243391 plus: ragged K/V copies through RowSplit with
# per-thread base pointers in shared memory (u32 strides: one wide multiply-add per row), the
# soft-cap's small form factored into the softmax exponents (FactoredSmallLogits), and mma.sync
# tiles with a wgmma twin no longer built for sm_90a. Full verify of new; ABBA main vs new.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
$B/attnforge-new verify --backend cuda --suite full --seed 181 > $OUT/verify-full.log 2>&1; vrc=$?
echo "verify full exit $vrc ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full.log)"
grep -E "^FAIL" $OUT/verify-full.log | head -10
t0=$(date +%s)
timeout 330 python3 bench/ab.py --bin main=$B/attnforge-main --bin new=$B/attnforge-new \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s16384-noncausal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s4096-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-softcap2 \
 --shape f16-d128-h32/8-s8192-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape f16-d64-h32/32-s4096-noncausal --shape f16-d256-h32/32-s4096-causal \
 --shape f16-d128-h32/32-ragged16-noncausal \
 --rounds 1 --out $OUT/ab-new.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-new.txt; echo "ab new ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
