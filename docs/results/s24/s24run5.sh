#!/usr/bin/env bash
# Session 24, device call 5: EPILOGUE_RELOADS_QO_LEN (the f16-QK causal paged two-warpgroup kernels
# read the query length again in the epilogue: their 4/4 B spill gone). The f16-QK cases of the
# full verify, then ABBA of the paged f16-QK prefill against main's binary (call 4 measured the
# per-warp path on it without the reload).
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
timeout 120 $B/attnforge verify --backend cuda --suite full --seed 2406 --filter qk16 > $OUT/verify-qk16.log 2>&1
echo "verify full qk16 exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-qk16.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-qk16.log | head -12
timeout 150 python3 bench/ab.py --bin main=$B/attnforge-main --bin s24=$B/attnforge \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal-f16qk \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
  --rounds 2 --out $OUT/ab.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab.txt
echo "total $(( $(date +%s) - T0 )) s"
