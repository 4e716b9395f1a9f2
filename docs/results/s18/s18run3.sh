#!/usr/bin/env bash
# Session 18, device call 3. tree = main + the softmax's per-thread reductions (row max, row sums,
# the soft-cap's small-form check) as balanced trees instead of running folds.
# Quick and full verify of tree; main's verify of the case that failed in run 2 (seed 212);
# ABBA main vs tree; ncu stall figures of tree.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 80 $B/attnforge-tree verify --backend cuda --suite quick --seed 221 > $OUT/verify-quick-tree.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-tree.log)"
grep -E "^FAIL" $OUT/verify-quick-tree.log | head -5
if ! grep -q " 0 failed" $OUT/verify-quick-tree.log; then tail -20 $OUT/verify-quick-tree.log; exit 1; fi
t0=$(date +%s)
timeout 160 $B/attnforge-tree verify --backend cuda --suite full --seed 222 > $OUT/verify-full-tree.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - t0 )) s): $(tail -1 $OUT/verify-full-tree.log)"
grep -E "^FAIL" $OUT/verify-full-tree.log | head -10
t0=$(date +%s)
timeout 60 $B/attnforge-main verify --backend cuda --suite full --seed 212 --filter qk16/d256/window0/custom -v > $OUT/verify-main-seed212.log 2>&1; echo "main seed 212 d256 window0 custom exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(ok|FAIL)|passed" $OUT/verify-main-seed212.log | cut -c1-200
timeout 60 $B/attnforge-tree verify --backend cuda --suite full --seed 212 --filter qk16/d256/window0/custom -v > $OUT/verify-tree-seed212.log 2>&1; grep -E "^(ok|FAIL)|passed" $OUT/verify-tree-seed212.log | cut -c1-200
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin main=$B/attnforge-main --bin tree=$B/attnforge-tree \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape bf16-d128-h32/8-s8192-causal --shape f16-d64-h32/32-s4096-causal \
 --shape f16-d128-h32/32-ragged16-causal --shape f16-d128-h32/32-s1024-noncausal \
 --rounds 1 --out $OUT/ab-tree.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-tree.txt; echo "ab tree ($(( $(date +%s) - t0 )) s)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for s in f16-d128-h32/32-s4096-causal f16-d128-h32/32-s4096-causal-softcap50; do
  t0=$(date +%s); tag=$(echo $s | tr '/' '_')
  timeout 40 $NCU --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --print-details all -k regex:attnforge_prefill -s 3 -c 1 $B/attnforge-tree bench --suite prefill --filter "$s" --runs 5 --warmup 2 > $OUT/ncu-tree-$tag.txt 2>&1
  echo "ncu $s exit $? ($(( $(date +%s) - t0 )) s)"
  grep -E "Duration|Issue Slots Busy|Pipe Tensor Cycles Active|^    Stall (Wait|Barrier|Not Selected|Dispatch|GMMA|Short|Long)" $OUT/ncu-tree-$tag.txt | head -12
done
echo "total $(( $(date +%s) - T0 )) s"
