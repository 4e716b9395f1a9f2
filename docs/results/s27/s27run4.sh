#!/usr/bin/env bash
# Session 27, device call 4 (main's binary; carry: [".device"]): the two levels of the causal
# seq-8192 shapes. Each run times 1000 launches (about 1.7 s of GPU time at D=256 32/8), long
# enough for nvidia-smi's 100 ms samples to show the SM clock during it: if the slow runs ran at
# a lower clock, it is the clock; if not, something that differs per process (where the buffers
# landed). Six runs of f16 D=256 32/8, then four of f16 D=128 32/32 (session 25's spread).
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin/attnforge-main
T0=$(date +%s)
python3 - <<'PY'
import json
d = json.load(open("bench/shapes.json"))
keep = {"f16-d256-h32/8-s8192-causal", "f16-d128-h32/32-s8192-causal"}
json.dump({"prefill": [s for s in d["prefill"] if s["name"] in keep], "paged": []}, open("/tmp/s8192.json", "w"))
PY
timeout 120 $B bench --all --shapes /tmp/s8192.json --runs 3 --warmup 1 > /dev/null 2>&1  # compile, untimed
sampled() {  # tag, bench filter
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 \
    > /tmp/clk-$1.csv &
  local smi=$!
  sleep 0.3
  timeout 120 $B bench --all --shapes /tmp/s8192.json --filter "$2" --runs 1000 --warmup 20 2>&1 | grep -E "s8192|error"
  kill $smi; wait $smi 2>/dev/null
  python3 - "$1" <<'PY'
import sys
rows = [l.split(", ") for l in open(f"/tmp/clk-{sys.argv[1]}.csv") if l.count(",") == 3]
busy = [(float(c), float(p)) for _, c, p, _ in rows if float(p) > 250]
if busy:
    cs, ps = zip(*busy)
    print(f"  {sys.argv[1]}: {len(busy)} of {len(rows)} samples above 250 W: SM clock mean {sum(cs)/len(cs):.0f} MHz "
          f"(min {min(cs):.0f}, max {max(cs):.0f}), power mean {sum(ps)/len(ps):.0f} W")
else:
    print(f"  {sys.argv[1]}: no sample above 250 W ({len(rows)} samples)")
PY
}
{
  for r in 1 2 3 4 5 6; do sampled d256-$r d256-h32/8-s8192-causal; done
  for r in 1 2 3 4; do sampled d128-$r d128-h32/32-s8192-causal; done
} 2>&1 | tee $OUT/s8192-levels.txt
tar czf $OUT/s8192-clock-samples.tgz -C /tmp $(cd /tmp && ls clk-*.csv)
echo "total $(( $(date +%s) - T0 )) s"
