#!/usr/bin/env bash
# Session 22, device call 1: the sm_80 spill fixes (PAGED_SUMS_CROWD, CAUSAL_F32_SUMS_IN_PIECES;
# only mma.sync kernels change): full verify on the device's tiles, full verify planning sm_80's
# tiles (--tiles-of sm_80), then ABBA of the changed sm_80 kernels against main's (same Rust code,
# main's prefill.cuh), timed on the H200 with --tiles-of sm_80 (a proxy), with unchanged controls.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 230 $B/attnforge verify --backend cuda --suite full --seed 2201 --tiles-of sm_80 > $OUT/verify-full-sm80.log 2>&1; echo "verify full sm80 tiles exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-sm80.log)"
head -1 $OUT/verify-full-sm80.log
grep -E "^FAIL|^error|^stopped" $OUT/verify-full-sm80.log | head -12
t0=$(date +%s)
timeout 150 python3 bench/ab.py --tiles-of sm_80 --bin main=$B/attnforge-main --bin s22=$B/attnforge \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape bf16-d128-h32/32-s4096-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape f16-d128-h32/32-s4096-causal --shape bf16-d128-h32/32-s4096-noncausal \
 --rounds 1 --out $OUT/ab-sm80.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-sm80.txt; echo "ab sm80 ($(( $(date +%s) - t0 )) s)"
grep -h '"kernel"' $OUT/ab-sm80.jsonl | python3 -c "
import json,sys
seen=set()
for l in sys.stdin:
  r=json.loads(l); k=(r['shape'],r.get('kernel'))
  if k not in seen: seen.add(k); print(r['bin'],r['shape'],r.get('kernel'))
" | sort -u
t0=$(date +%s)
timeout 200 $B/attnforge verify --backend cuda --suite full --seed 2202 > $OUT/verify-full.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full.log)"
head -1 $OUT/verify-full.log
grep -E "^FAIL|^error|^stopped" $OUT/verify-full.log | head -12
echo "total $(( $(date +%s) - T0 )) s"
