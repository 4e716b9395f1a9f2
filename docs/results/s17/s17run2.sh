#!/usr/bin/env bash
# Session 17, device call 2. tma = main 7ef82f0 plus whole K/V tiles of the ragged wgmma
# two-buffer kernels copied by the tensor memory accelerator (tensor maps encoded per launch,
# one mbarrier per buffer; partial tiles by cp.async). Quick then full verify; ABBA main vs tma.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 90 $B/attnforge-tma verify --backend cuda --suite quick --seed 192 > $OUT/verify-quick-tma.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-tma.log)"
grep -E "^FAIL" $OUT/verify-quick-tma.log | head -5
if ! grep -q " 0 failed" $OUT/verify-quick-tma.log; then tail -20 $OUT/verify-quick-tma.log; exit 1; fi
t0=$(date +%s)
timeout 200 $B/attnforge-tma verify --backend cuda --suite full --seed 193 > $OUT/verify-full-tma.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full-tma.log)"
grep -E "^FAIL" $OUT/verify-full-tma.log | head -10
t0=$(date +%s)
timeout 220 python3 bench/ab.py --bin main=$B/attnforge-main --bin tma=$B/attnforge-tma \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal \
 --shape f16-d128-h32/32-s1024-noncausal --shape f16-d128-h32/32-s16384-noncausal \
 --shape bf16-d128-h32/8-s8192-causal --shape f16-d128-h32/32-ragged16-noncausal \
 --shape f16-d128-h32/8-ragged16-causal --shape f16-d64-h32/32-s4096-noncausal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --rounds 1 --out $OUT/ab-tma.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-tma.txt; echo "ab tma ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
