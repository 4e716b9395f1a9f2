#!/usr/bin/env bash
# Session 27, device call 6: as call 5 (s27run5.sh), at head dim 256.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 380 bash scripts/gpu-suite --suite quick --bench prefill --filter -d256- --impls flashinfer-fa2,torch-cudnn \
  --out $OUT/d256
echo "gpu-suite d256 exit $? ($(( $(date +%s) - T0 )) s)"
