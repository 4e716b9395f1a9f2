#!/usr/bin/env bash
# Session 19, device call 2: wgmma descriptors in uniform registers (warp_uniform: the K/V
# buffer in every wgmma kernel, the warpgroup in the f16-QK ones) against main, ABBA in one
# call, after the verify suites.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 60 $B/attnforge-shfl verify --backend cuda --suite quick --seed 241 > $OUT/verify-quick-shfl.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-shfl.log)"
grep -E "^FAIL" $OUT/verify-quick-shfl.log | head -5
if ! grep -q " 0 failed" $OUT/verify-quick-shfl.log; then tail -20 $OUT/verify-quick-shfl.log; exit 1; fi
timeout 150 $B/attnforge-shfl verify --backend cuda --suite full --seed 242 > $OUT/verify-full-shfl.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-shfl.log)"
grep -E "^FAIL" $OUT/verify-full-shfl.log | head -5
t0=$(date +%s)
timeout 120 python3 bench/ab.py --bin main=$B/attnforge-main --bin shfl=$B/attnforge-shfl \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/8-s8192-causal-f16qk \
 --shape f16-d128-h32/32-s4096-noncausal-f16qk --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk \
 --shape f16-d64-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/8-ragged16-causal \
 --rounds 1 --out $OUT/ab-shfl.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-shfl.txt; echo "ab shfl ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
