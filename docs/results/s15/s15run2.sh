#!/usr/bin/env bash
# Session 15, device call 2. Three binaries: main (f93fea4), desc (wgmma descriptors built once
# per operand and advanced by one add), cta1 (desc, plus the two-warpgroup tiles declared at one
# CTA per SM, so that ptxas no longer serializes their wgmma for want of registers).
# Quick verify of desc and cta1; ABBA main vs desc; ABBA desc vs cta1.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
for b in desc cta1; do
  $B/attnforge-$b verify --backend cuda --suite quick --seed 152 > $OUT/verify-$b.log 2>&1
  echo "verify quick $b exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-$b.log)"
  grep -E "^FAIL" $OUT/verify-$b.log | head -5
done
t0=$(date +%s)
timeout 240 python3 bench/ab.py --bin main=$B/attnforge-main --bin desc=$B/attnforge-desc \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s16384-noncausal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s4096-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape f16-d64-h32/32-s4096-noncausal --shape f16-d256-h32/32-s4096-causal \
 --rounds 1 --out $OUT/ab-desc.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-desc.txt; echo "ab desc ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 240 python3 bench/ab.py --bin desc=$B/attnforge-desc --bin cta1=$B/attnforge-cta1 \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s16384-noncausal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s4096-causal --shape bf16-d128-h32/8-s8192-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-ragged16-noncausal \
 --shape f16-d64-h32/32-s4096-noncausal \
 --rounds 1 --out $OUT/ab-cta1.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-cta1.txt; echo "ab cta1 ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
