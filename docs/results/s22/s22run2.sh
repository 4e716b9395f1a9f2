#!/usr/bin/env bash
# Session 22, device call 2: PAGED_SUMS_CROWD (f32 row sums in the paged f32-QK 32-row mma.sync
# kernels at head dim 128) and BF16_CAUSAL_SUMS_BY_MMA (row sums by MMA in the bf16 causal ragged
# ones); run 1's 32-key pieces dropped (-8%): full verify planning sm_80's tiles, then ABBA (two rounds) against main's kernels with
# --tiles-of sm_80 on the paged prefill shapes it changes and an unchanged control.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 230 $B/attnforge verify --backend cuda --suite full --seed 2203 --tiles-of sm_80 > $OUT/verify-full-sm80.log 2>&1; echo "verify full sm80 tiles exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-sm80.log)"
head -1 $OUT/verify-full-sm80.log
grep -E "^FAIL|^error|^stopped" $OUT/verify-full-sm80.log | head -12
t0=$(date +%s)
timeout 260 python3 bench/ab.py --tiles-of sm_80 --bin main=$B/attnforge-main --bin crowd=$B/attnforge \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-noncausal \
 --shape bf16-d128-h32/32-s4096-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape f16-d128-h32/32-s4096-causal \
 --rounds 2 --out $OUT/ab-crowd.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-crowd.txt; echo "ab crowd ($(( $(date +%s) - t0 )) s)"
grep -h '"kernel"' $OUT/ab-crowd.jsonl | python3 -c "
import json,sys
seen=set()
for l in sys.stdin:
  r=json.loads(l); k=(r['bin'],r['shape'],r.get('kernel'))
  if k not in seen: seen.add(k); print(*k)
" | sort -u
echo "total $(( $(date +%s) - T0 )) s"
