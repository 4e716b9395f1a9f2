#!/usr/bin/env bash
# Session 19, device call 1, main at 3064e1d (code of 195f9be: the soft-cap's short form): issue
# 4's D=128 grid (and a probe of the f16-accumulating mma's rounding) beside FlashInfer FA2 and torch SDPA cuDNN, after the full verify suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
# The f16-accumulating mma's rounding against the reference's model (a probe, not the product).
( nvcc -arch=sm_90a -O2 -o /tmp/f16acc_probe .device/s19/f16acc_probe.cu && /tmp/f16acc_probe ) > $OUT/f16acc-probe.txt 2>&1
echo "probe exit $? ($(( $(date +%s) - T0 )) s)"; cat $OUT/f16acc-probe.txt
timeout 525 bash scripts/gpu-suite --suite full --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - T0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096-(non)?causal|softcap|f16qk|s8192" $OUT/suite/section-prefill.md | head -30
echo "total $(( $(date +%s) - T0 )) s"
