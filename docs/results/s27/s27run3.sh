#!/usr/bin/env bash
# Session 27, device call 3 (main's binary, .device/bin/attnforge-main; carry: [".device"]):
# 1. tensor-core rate of mma.sync with f16 against f32 accumulators (mma_accum_rate.cu, nvcc here):
#    the premise of the f16-QK target's analysis;
# 2. the SM clock and power sampled every 100 ms while head dim 256 runs: non-causal seq 4096 and
#    16384 (ncu in call 1 timed one launch of s16384 at 718 TFLOP/s, bench's median of back-to-back
#    launches says 628), then the causal 32/8 seq-8192 shape six times (bimodal in call 1).
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin/attnforge-main
T0=$(date +%s)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
( cd /tmp && $NVCC -O3 -arch=sm_90a -o mma_rate "$OLDPWD/docs/results/s27/mma_accum_rate.cu" && ./mma_rate ) \
  2>&1 | tee $OUT/mma-accum-rate.md
echo "mma done ($(( $(date +%s) - T0 )) s)"
python3 - <<'PY'
import json
d = json.load(open("bench/shapes.json"))
sub = [s for s in d["prefill"] if s["head_dim"] == 256 and s["dtype"] == "f16"]
json.dump({"prefill": sub, "paged": []}, open("/tmp/d256-f16.json", "w"))
PY
# Compile the kernels once, untimed, so that the sampled runs below are the bench alone.
timeout 120 $B bench --all --shapes /tmp/d256-f16.json --filter h32/32-s4096-noncausal --runs 3 --warmup 1 > /dev/null 2>&1
timeout 120 $B bench --all --shapes /tmp/d256-f16.json --filter h32/8-s8192-causal --runs 3 --warmup 1 > /dev/null 2>&1
sampled() {  # tag, bench filter
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 \
    > /tmp/clk-$1.csv &
  local smi=$!
  sleep 0.5
  timeout 120 $B bench --all --shapes /tmp/d256-f16.json --filter "$2" 2>&1 | grep -E "d256|error"
  kill $smi; wait $smi 2>/dev/null
  python3 - "$1" <<'PY'
import sys
rows = [l.split(", ") for l in open(f"/tmp/clk-{sys.argv[1]}.csv") if l.count(",") == 3]
busy = [(float(c), float(p), float(t)) for _, c, p, t in rows if float(p) > 300]
if busy:
    cs, ps, ts = zip(*busy)
    print(f"  {sys.argv[1]}: {len(busy)} samples above 300 W: SM clock mean {sum(cs)/len(cs):.0f} MHz "
          f"(min {min(cs):.0f}, max {max(cs):.0f}), power mean {sum(ps)/len(ps):.0f} W (max {max(ps):.0f}), "
          f"temperature {min(ts):.0f}-{max(ts):.0f} C")
else:
    print(f"  {sys.argv[1]}: no sample above 300 W ({len(rows)} samples)")
PY
}
{
  sampled nc4096 h32/32-s4096-noncausal
  sampled nc16384 h32/32-s16384-noncausal
  sampled nc4096b h32/32-s4096-noncausal
  for r in 1 2 3 4 5 6; do sampled c8192-$r h32/8-s8192-causal; done
} 2>&1 | tee $OUT/clocks-d256.txt
tar czf $OUT/clock-samples.tgz -C /tmp $(cd /tmp && ls clk-*.csv)
echo "total $(( $(date +%s) - T0 )) s"
