#!/usr/bin/env bash
# Session 14, device call 4: main's final binary. The head-dim-128 list of the issue (the grid,
# soft-cap 50, f16 QK, ragged 16) beside FlashInfer FA2 and torch SDPA (flash and cuDNN) in one
# call; gpu-suite runs the quick verify first.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
timeout 540 bash scripts/gpu-suite --suite quick --bench prefill --filter -d128- --impls flashinfer-fa2,torch-flash,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -2; grep geometric $OUT/suite.log
grep -E "softcap|f16qk|ragged|s4096-causal \|" $OUT/suite/section-prefill.md | head -30
ls $OUT/suite
