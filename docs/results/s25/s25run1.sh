#!/usr/bin/env bash
# Session 25, device call 1: QK_IN_TURNS (the two warpgroups of a wgmma CTA issue each tile's
# S = Q K^T in turn, warpgroup 0 first, through named barrier 3). The whole full verify first
# (every two-warpgroup kernel changes; a barrier mistake would hang, hence the timeout), then one
# ABBA round against main's binary (0f1bb6a) on the shapes whose kernels change, with head dim 256
# (one warpgroup, unchanged) as the control.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 220 $B/attnforge verify --backend cuda --suite full --seed 2501 > $OUT/verify-full.log 2>&1
echo "verify full exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full.log)"
grep -E "^FAIL|^error|^stopped" $OUT/verify-full.log | head -12
t0=$(date +%s)
timeout 420 python3 bench/ab.py --bin main=$B/attnforge-main --bin s25=$B/attnforge \
  --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal \
  --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-noncausal-f16qk \
  --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk \
  --shape f16-d128-h32/8-s8192-causal --shape bf16-d128-h32/32-s4096-noncausal \
  --shape f16-d128-h32/32-s1024-noncausal --shape f16-d128-h32/32-ragged16-causal \
  --shape f16-d64-h32/32-s4096-causal --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
  --shape f16-d256-h32/32-s4096-causal \
  --rounds 1 --out $OUT/ab.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab.txt
echo "ab exit ${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
