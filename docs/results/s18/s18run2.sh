#!/usr/bin/env bash
# Session 18, device call 2. rel = main + K/V buffers handed back without a CTA barrier per tile
# (the last warp out of tile t issues tile t + 2's TMA boxes; KV_RELEASE_BY_LAST_WARP).
# Quick and full verify of rel; ABBA main vs rel; ncu stall figures of rel.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 80 $B/attnforge-rel verify --backend cuda --suite quick --seed 211 > $OUT/verify-quick-rel.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-rel.log)"
grep -E "^FAIL" $OUT/verify-quick-rel.log | head -5
if ! grep -q " 0 failed" $OUT/verify-quick-rel.log; then tail -20 $OUT/verify-quick-rel.log; exit 1; fi
t0=$(date +%s)
timeout 160 $B/attnforge-rel verify --backend cuda --suite full --seed 212 > $OUT/verify-full-rel.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full-rel.log)"
grep -E "^FAIL" $OUT/verify-full-rel.log | head -10
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin main=$B/attnforge-main --bin rel=$B/attnforge-rel \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape bf16-d128-h32/8-s8192-causal --shape f16-d64-h32/32-s4096-causal \
 --shape f16-d128-h32/32-ragged16-causal --shape f16-d128-h32/32-s1024-noncausal \
 --rounds 1 --out $OUT/ab-rel.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-rel.txt; echo "ab rel ($(( $(date +%s) - t0 )) s)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for s in f16-d128-h32/32-s4096-causal; do
  t0=$(date +%s); tag=$(echo $s | tr '/' '_')
  timeout 40 $NCU --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --print-details all -k regex:attnforge_prefill -s 3 -c 1 $B/attnforge-rel bench --suite prefill --filter "$s" --runs 5 --warmup 2 > $OUT/ncu-rel-$tag.txt 2>&1
  echo "ncu $s exit $? ($(( $(date +%s) - t0 )) s)"
  grep -E "Duration|Issue Slots Busy|Pipe Tensor Cycles Active|^    Stall (Wait|Barrier|Not Selected|Dispatch|GMMA|Short|Long)" $OUT/ncu-rel-$tag.txt | head -12
done
echo "total $(( $(date +%s) - T0 )) s"
