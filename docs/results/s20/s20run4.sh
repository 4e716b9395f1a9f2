#!/usr/bin/env bash
# Session 20, device call 4, main at 99fc66e: ABBA of the bf16 exponents after the rescale (against
# ba0a62d, `main`) on the bf16 kernels it un-serializes, then issue 4's D=128 grid beside FlashInfer
# FA2 and torch SDPA cuDNN after the full verify suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 45 python3 bench/ab.py --bin main=$B/attnforge-main --bin bf16fix=$B/attnforge \
 --shape bf16-d128-h32/8-s8192-noncausal --shape bf16-d128-h32/32-s4096-noncausal \
 --shape f16-d128-h32/32-s4096-causal \
 --rounds 1 --out $OUT/ab-bf16.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-bf16.txt; echo "ab bf16 ($(( $(date +%s) - T0 )) s)"
timeout 535 bash scripts/gpu-suite --suite full --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - T0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096-(non)?causal|softcap|f16qk|s8192" $OUT/suite/section-prefill.md | head -30
echo "total $(( $(date +%s) - T0 )) s"
