#!/usr/bin/env bash
# Session 26, device call 3: main's candidate (the D=256 two-warpgroup planner and widen-first
# f16 QK at head dim 256) beside the peers: the D=256 grid of issue 4 beside FlashInfer FA2 and
# cuDNN (quick verify first, inside gpu-suite).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 480 bash scripts/gpu-suite --suite quick --bench prefill --filter -d256- --impls flashinfer-fa2,torch-cudnn \
  --out $OUT/d256
echo "gpu-suite d256 exit $? ($(( $(date +%s) - T0 )) s)"
