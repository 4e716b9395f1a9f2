#!/usr/bin/env bash
# Session 13, device call 5: the merge candidate (wgmma for f32 QK at head dims 64, 128, 256;
# f16 QK back on mma.sync). Full verify, quick verify at seed 1, then the D=256 grid beside
# FlashInfer FA2 (gpu-suite runs its own quick verify first).
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge verify --backend cuda --suite full --seed 91 > $OUT/verify-full.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-full.log; grep -E "^FAIL" $OUT/verify-full.log | head
t0=$(date +%s)
bash scripts/gpu-suite --suite quick --bench prefill --filter -d256- --impls flashinfer-fa2 --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed|x \|$" $OUT/suite.log | awk -F'|' '{print $2, $5}' | sort -k2 -n | head -50; grep geometric $OUT/suite.log
