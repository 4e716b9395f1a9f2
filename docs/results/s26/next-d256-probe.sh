#!/usr/bin/env bash
# NOT RUN: written in session 26 (no device time left) for the next session: the three open
# observations at head dim 256 in docs/perf-notes.md ("Open observations at head dim 256").
# 1. The seq-8192 causal spread between bench processes: the same shape six times, one process
#    each, with the clocks and power logged around each.
# 2. DRAM and L2 traffic of the two-warpgroup tile at non-causal seq 4096 (the peak) and 16384
#    (-9%), and seq 1024 (the fixed cost per CTA): ncu's memory sections, one launch each.
# Run as `bash docs/results/s26/next-d256-probe.sh` with `carry: [".device"]` (about 250 s).
set -uo pipefail
B=.device/bin/attnforge
export ATTNFORGE_CACHE_DIR=/tmp/afcache
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# The f16 D=256 shapes alone (`--filter` would also match the bf16 names, which contain them).
python3 - <<'PY'
import json
d = json.load(open("bench/shapes.json"))
sub = [s for s in d["prefill"] if s["head_dim"] == 256 and s["dtype"] == "f16"]
json.dump({"prefill": sub, "paged": []}, open("/tmp/d256-f16.json", "w"))
PY
T0=$(date +%s)
for r in 1 2 3 4 5 6; do
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  timeout 60 $B bench --all --shapes /tmp/d256-f16.json --filter h32/8-s8192-causal 2>&1 | grep -E "d256|error"
done | tee $OUT/s8192-spread.txt
echo "spread ($(( $(date +%s) - T0 )) s)"
for s in h32/32-s4096-noncausal h32/32-s16384-noncausal h32/32-s1024-noncausal; do
  t0=$(date +%s); tag=$(echo $s | tr '/' '_')
  timeout 90 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats --print-details all \
    -k regex:attnforge_prefill -s 3 -c 1 $B bench --all --shapes /tmp/d256-f16.json --filter "$s" --runs 5 --warmup 2 \
    > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $s exit $? ($(( $(date +%s) - t0 )) s)"
  grep -E "Duration|DRAM Throughput|dram__bytes|L2 Hit Rate|Memory Throughput|Achieved Occupancy" $OUT/ncu-$tag.txt | head -12
done
echo "total $(( $(date +%s) - T0 )) s"
