#!/usr/bin/env bash
# Session 17, device call 4. s17 = main 51b84e8 (ragged TMA; paged boxes issued by one lane per
# warp) plus the custom-mask bits read as aligned words per row and sub-tile (helper commit
# d1de9fa). Full verify; ABBA 7ef82f0 vs s17 on the paged prefill and two ragged controls.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 200 $B/attnforge-s17 verify --backend cuda --suite full --seed 195 > $OUT/verify-full-s17.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-s17.log)"
grep -E "^FAIL" $OUT/verify-full-s17.log | head -10
t0=$(date +%s)
timeout 120 python3 bench/ab.py --bin main=$B/attnforge-main --bin s17=$B/attnforge-s17 \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d64-h32/32-s4096-noncausal \
 --rounds 1 --out $OUT/ab-s17.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-s17.txt; echo "ab s17 ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
