#!/usr/bin/env bash
# Session 13, device call 1: branch wgmma (D=64 f32-QK kernels on sm_90a run S = Q K^T and
# O += P V as wgmma.m64n64k16). Full verify of the branch; ABBA main (mma.sync) vs wgmma on
# D=64 shapes; if verify passed, the D=64 grid beside FlashInfer FA2.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge verify --backend cuda --suite full --seed 61 > $OUT/verify-g.log 2>&1; vrc=$?
echo "verify g exit $vrc ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-g.log
grep -E "^FAIL" $OUT/verify-g.log | head -20
$B/attnforge verify --backend cuda --suite full --seed 62 --filter d64 -v > $OUT/verify-d64-g.log 2>&1; echo "d64 verbose exit $?"; tail -1 $OUT/verify-d64-g.log
t0=$(date +%s)
python3 bench/ab.py --bin main=$B/attnforge-main --bin g=$B/attnforge \
 --shape bf16-d64-h32/32-s1024-noncausal --shape bf16-d64-h32/32-s2048-noncausal --shape bf16-d64-h32/8-s2048-noncausal \
 --shape bf16-d64-h32/32-s4096-noncausal --shape bf16-d64-h32/32-s4096-causal --shape bf16-d64-h32/32-s16384-noncausal \
 --shape f16-d64-h32/32-s2048-noncausal --shape f16-d64-h32/32-s512-causal \
 --rounds 1 --out $OUT/ab-g.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-g.txt; echo "ab g ($(( $(date +%s) - t0 )) s)"
if [ $vrc -eq 0 ]; then
  t0=$(date +%s)
  bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2 --out $OUT/suite > $OUT/suite.log 2>&1
  echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; tail -60 $OUT/suite.log | grep -E "d64|geomean|below" | head -60
fi
