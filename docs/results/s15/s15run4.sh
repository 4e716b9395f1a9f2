#!/usr/bin/env bash
# Session 15, device call 4: main ac38416 against `rescale` (o rescaled after every sub-tile in
# the two-warpgroup f32-QK D=128 twins, so that ptxas pipelines their wgmma: 0 of 440 D=128
# f32-QK kernels serialized instead of 48). ABBA first, then a quick verify of rescale.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
timeout 130 python3 bench/ab.py --bin main=$B/attnforge-main15 --bin rescale=$B/attnforge-rescale \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s16384-noncausal \
 --shape f16-d128-h32/32-s4096-causal --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-ragged16-noncausal \
 --rounds 1 --out $OUT/ab-rescale.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-rescale.txt; echo "ab rescale ($(( $(date +%s) - T0 )) s)"
timeout 40 $B/attnforge-rescale verify --backend cuda --suite quick --seed 171 > $OUT/verify-rescale.log 2>&1
echo "verify quick rescale exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-rescale.log)"
grep -E "^FAIL" $OUT/verify-rescale.log | head -5
