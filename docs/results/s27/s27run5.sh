#!/usr/bin/env bash
# Session 27, device call 5: main's kernels beside FlashInfer FA2 and cuDNN at head dims 128 and 64,
# with `attnforge bench` timing as the peers do (this session's change: launches until 300 ms of
# GPU time, 50 to 200; before, 50 whatever their time, about a quarter of the peers' on the
# heaviest shapes, so ours ran more at the boost clock). Quick verify first, inside gpu-suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 330 bash scripts/gpu-suite --suite quick --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn \
  --out $OUT/d128
echo "gpu-suite d128 exit $? ($(( $(date +%s) - T0 )) s)"
t0=$(date +%s)
timeout 240 bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2,torch-cudnn \
  --out $OUT/d64
echo "gpu-suite d64 exit $? ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
