#!/usr/bin/env bash
# Session 25, device call 4: main (215cb94) beside the peers: the D=128 grid of issue 4 beside
# FlashInfer FA2 and cuDNN (quick verify first, inside gpu-suite), then our f16-QK kernels at head
# dims 64 and 256 beside their f32-QK twins (no peer compiles f16 QK), each shape twice.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 400 bash scripts/gpu-suite --suite quick --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn \
  --out $OUT/d128
echo "gpu-suite d128 exit $? ($(( $(date +%s) - T0 )) s)"
t0=$(date +%s)
export ATTNFORGE_CACHE_DIR=/tmp/afcache-f16qk
for f in f16-d64-h32/32-s4096-causal f16-d256-h32/32-s4096-causal f16-d256-h32/32-s4096-noncausal; do
  for r in 1 2; do
    echo "== run $r: $f"; timeout 60 .device/bin/attnforge bench --all --filter "$f" 2>&1 | tail -8
  done
done | tee $OUT/f16qk-twins.txt
echo "f16qk twins ($(( $(date +%s) - t0 )) s); total $(( $(date +%s) - T0 )) s"
