#!/usr/bin/env bash
# Session 24, device call 4: F16_WARP_CHOICE again, two ABBA rounds: the paged f16-QK prefill (its
# kernels took the per-warp path too, not timed in call 2) beside its f32-QK twin (unchanged), and
# the ragged f16-QK shapes of call 2 with their f32 controls.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 400 python3 bench/ab.py --bin main=$B/attnforge-main --bin s24=$B/attnforge \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal-f16qk \
  --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
  --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal \
  --shape f16-d128-h32/32-s4096-noncausal-f16qk --shape f16-d128-h32/32-s4096-noncausal \
  --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d128-h32/8-s8192-causal \
  --rounds 2 --out $OUT/ab.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab.txt
echo "ab ($(( $(date +%s) - T0 )) s)"
