#!/usr/bin/env bash
# Session 15, device call 1: main f93fea4. Full verify (fresh seed; first GPU run of fd637cb),
# then the head-dim-128 list of the issue beside FlashInfer FA2 and torch SDPA (flash, cuDNN)
# in one call (gpu-suite runs the quick verify first).
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
$B/attnforge verify --backend cuda --suite full --seed 151 > $OUT/verify-full.log 2>&1; vrc=$?
echo "verify full exit $vrc ($(( $(date +%s) - T0 )) s)"; tail -1 $OUT/verify-full.log
grep -E "^FAIL" $OUT/verify-full.log | head -20
left=$(( 585 - ($(date +%s) - T0) ))
t0=$(date +%s)
timeout $left bash scripts/gpu-suite --suite quick --bench prefill --filter -d128- --impls flashinfer-fa2,torch-flash,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -2; grep geometric $OUT/suite.log
grep -E "softcap|f16qk|ragged|s4096-causal \|" $OUT/suite/section-prefill.md | head -30
ls $OUT/suite
