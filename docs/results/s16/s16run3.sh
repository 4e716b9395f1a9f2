#!/usr/bin/env bash
# Session 16, device call 3. both = run 1's new (ragged copies + factored soft-cap) plus run 2's
# row sums by mma.sync in the wgmma kernels. Quick verify of both; ABBA new vs both.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
$B/attnforge-both verify --backend cuda --suite quick --seed 183 > $OUT/verify-quick.log 2>&1; vrc=$?
echo "verify quick exit $vrc ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick.log)"
grep -E "^FAIL" $OUT/verify-quick.log | head -10
t0=$(date +%s)
timeout 300 python3 bench/ab.py --bin new=$B/attnforge-new --bin both=$B/attnforge-both \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s1024-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-softcap2 \
 --shape f16-d128-h32/8-s8192-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape f16-d64-h32/32-s4096-noncausal --shape f16-d64-h32/32-s4096-causal \
 --shape f16-d256-h32/32-s4096-causal --shape f16-d128-h32/32-ragged16-noncausal \
 --rounds 1 --out $OUT/ab-both.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-both.txt; echo "ab both ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
