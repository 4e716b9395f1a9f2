#!/usr/bin/env bash
# Session 25, device call 3. The candidate main (215cb94: K_FREE_BEFORE_PV and the f16 ragged
# unmasked kernels' f32 sums after the rescale): the whole full verify. Then an experiment on it,
# ear: the exponents after the rescale also in the other D=128 two-warpgroup kernels without a
# transform that add their sums in f32 (f16 QK; f32 QK causal over ragged K/V), its D=128 cases of
# the full verify, and ABBA against the candidate (2 rounds), the f16 non-causal shape the control.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
export ATTNFORGE_CACHE_DIR=/tmp/afcache-main
timeout 220 $B/attnforge verify --backend cuda --suite full --seed 2504 > $OUT/verify-full.log 2>&1
echo "verify full exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-full.log | head -12
t0=$(date +%s)
export ATTNFORGE_CACHE_DIR=/tmp/afcache-ear
timeout 150 $B/attnforge-ear verify --backend cuda --suite full --seed 2505 --filter /d128/ > $OUT/verify-ear-d128.log 2>&1
echo "verify ear /d128/ exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-ear-d128.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-ear-d128.log | head -12
unset ATTNFORGE_CACHE_DIR
t0=$(date +%s)
timeout 300 python3 bench/ab.py --bin cand=$B/attnforge --bin ear=$B/attnforge-ear \
  --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/8-s8192-causal \
  --shape bf16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-ragged16-causal \
  --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/8-s8192-causal-f16qk \
  --shape f16-d128-h32/32-s4096-noncausal-f16qk --shape f16-d128-h32/32-s4096-noncausal \
  --rounds 2 --out $OUT/ab-ear.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-ear.txt
echo "ab ear exit ${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
