#!/usr/bin/env bash
# Session 18, device call 4. short = main + the soft-cap's short form: for sub-tiles whose
# accumulators all have |s| <= cap / 10, the exponent's factor is the quadratic
# LOG2E post_scale (1 + c1 (s / cap)^2) (one FMUL and one FFMA per logit fewer than the small
# form's cubic in s^2). Quick and full verify of short; ABBA main vs short.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 80 $B/attnforge-short verify --backend cuda --suite quick --seed 231 > $OUT/verify-quick-short.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-short.log)"
grep -E "^FAIL" $OUT/verify-quick-short.log | head -5
if ! grep -q " 0 failed" $OUT/verify-quick-short.log; then tail -20 $OUT/verify-quick-short.log; exit 1; fi
t0=$(date +%s)
timeout 160 $B/attnforge-short verify --backend cuda --suite full --seed 232 > $OUT/verify-full-short.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full-short.log)"
grep -E "^FAIL" $OUT/verify-full-short.log | head -10
t0=$(date +%s)
timeout 60 $B/attnforge-short verify --backend cuda --suite full --seed 233 --filter softcap -v > $OUT/verify-softcap-short.log 2>&1; echo "verify full softcap seed 233 exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-softcap-short.log)"
grep -E "^FAIL" $OUT/verify-softcap-short.log | head -10
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin main=$B/attnforge-main --bin short=$B/attnforge-short \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s8192-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk --shape f16-d128-h32/8-s8192-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal-softcap2 --shape f16-d256-h32/32-s4096-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal \
 --rounds 1 --out $OUT/ab-short.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-short.txt; echo "ab short ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
