#!/usr/bin/env bash
# Session 14, device call 1: the 8-warp wgmma twin (w8q1kv64g: two warpgroups of 64 rows) for the
# 128-row head-dim-128 tile, every variant (AF_W8=1), against main's w4q2kv64g / w4q2kv64 (same
# binary without it). Full verify with it; ABBA on the head-dim-128 shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge-w8 verify --backend cuda --suite full --seed 101 > $OUT/verify-w8.log 2>&1; vrc=$?
echo "verify w8 exit $vrc ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-w8.log
grep -E "^FAIL" $OUT/verify-w8.log | head -20
t0=$(date +%s)
timeout 360 python3 bench/ab.py --bin main=$B/attnforge --bin w8=$B/attnforge-w8 \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s4096-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal-softcap2 --shape bf16-d128-h32/8-s8192-causal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s512-causal --shape f16-d128-h32/32-ragged16-causal --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/8-s8192-causal-softcap50 \
 --rounds 1 --out $OUT/ab-w8.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-w8.txt; echo "ab w8 ($(( $(date +%s) - t0 )) s)"
