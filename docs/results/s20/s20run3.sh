#!/usr/bin/env bash
# Session 20, device call 3, main at ba0a62d: issue 4's D=256 grid beside FlashInfer FA2 and torch
# SDPA cuDNN, after the quick verify suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 560 bash scripts/gpu-suite --suite quick --bench prefill --filter -d256- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - T0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096-(non)?causal|softcap|s512" $OUT/suite/section-prefill.md | head -20
echo "total $(( $(date +%s) - T0 )) s"
