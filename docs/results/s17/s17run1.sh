#!/usr/bin/env bash
# Session 17, device call 1. new = main 7ef82f0 plus the f16-QK hot path's exponents on packed
# halves (two HFMA2 + MUFU.EX2.F16 per pair, references kept as f16 values, sums by mma in the
# f16-QK wgmma kernels). ex2.approx.f16 accuracy; full verify of new (errors of the qk16 cases
# beside main's on the same seed); ABBA main vs new on the f16-QK shapes and f32 controls.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
nvcc -arch=sm_90a -O2 -o /tmp/ex2f16 .device/s17/ex2f16.cu && /tmp/ex2f16 | tee $OUT/ex2f16.txt
$B/attnforge-new verify --backend cuda --suite full --seed 191 -v > $OUT/verify-full-new.log 2>&1; vrc=$?
echo "verify full new exit $vrc ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-new.log)"
grep -E "^FAIL" $OUT/verify-full-new.log | head -10
t0=$(date +%s)
$B/attnforge-main verify --backend cuda --suite full --seed 191 -v --filter qk16 > $OUT/verify-qk16-main.log 2>&1
echo "verify qk16 main exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-qk16-main.log)"
t0=$(date +%s)
timeout 200 python3 bench/ab.py --bin main=$B/attnforge-main --bin new=$B/attnforge-new \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal \
 --shape f16-d128-h32/32-s8192-causal-f16qk --shape f16-d128-h32/8-s8192-causal-f16qk \
 --shape f16-d128-h32/32-s4096-noncausal-f16qk --shape f16-d128-h32/32-s4096-noncausal \
 --shape f16-d64-h32/32-s4096-causal-f16qk --shape f16-d256-h32/32-s4096-causal-f16qk \
 --rounds 1 --out $OUT/ab-new.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-new.txt; echo "ab new ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
