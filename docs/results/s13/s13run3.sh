#!/usr/bin/env bash
# Session 13, device call 3: branch wgmma with head dim 256 (single-buffer twin) and f16 QK
# (wgmma f16 accumulators, CTA-wide overflow vote, f32 recompute of an overflowed sub-tile).
# Full verify; ABBA main vs wgmma on f16-QK and D=256 shapes; the D=256 grid beside FlashInfer.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge verify --backend cuda --suite full --seed 81 > $OUT/verify-g.log 2>&1; vrc=$?
echo "verify g exit $vrc ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-g.log
grep -E "^FAIL" $OUT/verify-g.log | head -20
t0=$(date +%s)
python3 bench/ab.py --bin main=$B/attnforge-main --bin g=$B/attnforge \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/8-s8192-causal-f16qk \
 --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk --shape f16-d256-h32/32-s4096-causal-f16qk --shape f16-d256-h32/32-s4096-noncausal-f16qk \
 --shape bf16-d256-h32/8-s512-noncausal --shape f16-d256-h32/32-s2048-noncausal --shape f16-d256-h32/8-s16384-noncausal \
 --rounds 1 --out $OUT/ab-g.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-g.txt; echo "ab g ($(( $(date +%s) - t0 )) s)"
if [ $vrc -eq 0 ]; then
  t0=$(date +%s)
  bash scripts/gpu-suite --suite quick --bench prefill --filter -d256- --impls flashinfer-fa2 --out $OUT/suite > $OUT/suite.log 2>&1
  echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "x \|$" $OUT/suite.log | awk -F'|' '{print $2, $5}' | sort -k2 -n | head -12; grep geometric $OUT/suite.log
fi
