#!/usr/bin/env bash
# Session 17, device call 5. final = s17 (run 4) with the paged TMA taken out again (paged
# kernels copy with cp.async, as in run 2's tma), and the custom-mask words only in wgmma kernels
# (helper commit 48ab6d8). Quick verify; ABBA 7ef82f0 vs final.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 80 $B/attnforge-final verify --backend cuda --suite quick --seed 196 > $OUT/verify-quick-final.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-final.log)"
grep -E "^FAIL" $OUT/verify-quick-final.log | head -10
t0=$(date +%s)
timeout 80 $B/attnforge-final verify --backend cuda --suite full --seed 197 --filter custom > $OUT/verify-custom-final.log 2>&1; echo "verify full custom exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-custom-final.log)"
grep -E "^FAIL" $OUT/verify-custom-final.log | head -10
t0=$(date +%s)
timeout 80 python3 bench/ab.py --bin main=$B/attnforge-main --bin final=$B/attnforge-final \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-causal-f16qk \
 --rounds 1 --out $OUT/ab-final.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-final.txt; echo "ab final ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
