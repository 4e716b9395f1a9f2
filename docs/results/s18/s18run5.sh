#!/usr/bin/env bash
# Session 18, device call 5, main at 195f9be (the soft-cap's short form): the D=64 part of issue
# 4's grid beside FlashInfer FA2 and torch SDPA cuDNN (gpu-suite runs the quick verify first).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 480 bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - T0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
echo "total $(( $(date +%s) - T0 )) s"
