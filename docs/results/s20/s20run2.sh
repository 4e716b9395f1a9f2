#!/usr/bin/env bash
# Session 20, device call 2: the update's vote (references kept without the quad reduction; the
# soft-cap forms' bound from the largest |acc|) against main f18a893 (base): full verify of it,
# ABBA on the headline, soft-cap, f16-QK, bf16, D=64/256 shapes; and row sums by the tensor cores
# for the soft-capped f32-QK wgmma kernels (sums) against it, quick verify and ABBA.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 170 $B/attnforge-kept verify --backend cuda --suite full --seed 2003 > $OUT/verify-full-kept.log 2>&1; echo "verify full kept exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full-kept.log)"
grep -E "^FAIL" $OUT/verify-full-kept.log | head -8
timeout 60 $B/attnforge-sums verify --backend cuda --suite quick --seed 2004 > $OUT/verify-quick-sums.log 2>&1; echo "verify quick sums exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-sums.log)"
grep -E "^FAIL" $OUT/verify-quick-sums.log | head -5
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin base=$B/attnforge-base --bin kept=$B/attnforge-kept \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/8-s8192-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal-softcap2 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk --shape bf16-d128-h32/8-s8192-noncausal \
 --shape f16-d64-h32/32-s4096-causal --shape f16-d256-h32/32-s4096-causal \
 --shape f16-d256-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/8-ragged16-causal \
 --rounds 1 --out $OUT/ab-kept.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-kept.txt; echo "ab kept ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 60 python3 bench/ab.py --bin kept=$B/attnforge-kept --bin sums=$B/attnforge-sums \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/8-s8192-causal-softcap50 \
 --shape f16-d128-h32/32-s4096-causal-softcap2 --shape f16-d128-h32/32-s8192-causal-softcap50 \
 --rounds 1 --out $OUT/ab-sums.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-sums.txt; echo "ab sums ($(( $(date +%s) - t0 )) s)"
echo "total $(( $(date +%s) - T0 )) s"
