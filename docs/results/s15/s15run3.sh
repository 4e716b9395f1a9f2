#!/usr/bin/env bash
# Session 15, device call 3. fromacc = main ffc204a (wgmma descriptors advanced by one add) plus
# the soft-cap taken from the accumulator in the wgmma kernels. Full verify of fromacc; ABBA desc
# (main) vs fromacc on the soft-cap shapes; then the head-dim-128 list beside FlashInfer FA2 and
# torch SDPA cuDNN with fromacc (its other kernels are main's, SASS identical).
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
$B/attnforge-fromacc verify --backend cuda --suite full --seed 161 > $OUT/verify-full.log 2>&1; vrc=$?
echo "verify full exit $vrc ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full.log)"
grep -E "^FAIL" $OUT/verify-full.log | head -10
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin desc=$B/attnforge-desc --bin fromacc=$B/attnforge-fromacc \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-softcap2 \
 --shape f16-d128-h32/32-s8192-causal-softcap50 --shape f16-d128-h32/8-s8192-causal-softcap50 \
 --shape f16-d256-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal \
 --rounds 1 --out $OUT/ab-fromacc.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-fromacc.txt; echo "ab fromacc ($(( $(date +%s) - t0 )) s)"
left=$(( 570 - ($(date +%s) - T0) ))
t0=$(date +%s)
timeout $left bash scripts/gpu-suite --suite quick --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096-(non)?causal|softcap|f16qk|ragged|s8192" $OUT/suite/section-prefill.md | head -30
echo "total $(( $(date +%s) - T0 )) s"
