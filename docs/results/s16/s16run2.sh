#!/usr/bin/env bash
# Session 16, device call 2. loads = run 1's new without the factored soft-cap form (main plus
# the ragged copies and the sm_90a matrix change); sums = loads plus the row sums by mma.sync of
# the f16 P blocks in the wgmma kernels (SUM_BY_MMA for WGMMA). Full verify of sums; ABBA main vs
# loads on the soft-cap shapes (is the factored form what cost run 1's soft-cap?), loads vs sums.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
$B/attnforge-sums verify --backend cuda --suite full --seed 182 > $OUT/verify-full.log 2>&1; vrc=$?
echo "verify full exit $vrc ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full.log)"
grep -E "^FAIL" $OUT/verify-full.log | head -10
t0=$(date +%s)
timeout 120 python3 bench/ab.py --bin main=$B/attnforge-main --bin loads=$B/attnforge-loads \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-softcap2 \
 --shape f16-d128-h32/8-s8192-causal-softcap50 --shape f16-d128-h32/32-s4096-causal \
 --rounds 1 --out $OUT/ab-loads.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-loads.txt; echo "ab loads ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 280 python3 bench/ab.py --bin loads=$B/attnforge-loads --bin sums=$B/attnforge-sums \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s4096-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-softcap2 \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d64-h32/32-s4096-noncausal \
 --shape bf16-d64-h32/32-s4096-noncausal --shape f16-d256-h32/32-s4096-causal \
 --shape f16-d128-h32/32-ragged16-noncausal \
 --rounds 1 --out $OUT/ab-sums.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-sums.txt; echo "ab sums ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
