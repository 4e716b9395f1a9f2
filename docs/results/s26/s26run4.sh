#!/usr/bin/env bash
# Session 26, device call 4 (the budget's last 420 s): main's candidate (call 3's binary): the full
# verify, then the D=64 grid of issue 4 beside FlashInfer FA2 and cuDNN (last run in session 21;
# its kernels have not changed since, and the planner's choice for it is the same).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 120 .device/bin/attnforge verify --backend cuda --suite full > $OUT/verify-full.log 2>&1
echo "verify exit $? ($(( $(date +%s) - T0 )) s)"; tail -1 $OUT/verify-full.log
timeout 260 bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2,torch-cudnn \
  --out $OUT/d64 > $OUT/d64-suite.log 2>&1
echo "gpu-suite d64 exit $? ($(( $(date +%s) - T0 )) s)"; grep -E "geometric|step summary" -A0 $OUT/d64-suite.log
