#!/usr/bin/env bash
# Session 27, device call 1 (run as `bash docs/results/s27/s27run1.sh`, carry: [".device"]):
# 1. session 26's head-dim-256 probe (docs/results/s26/next-d256-probe.sh: the seq-8192 causal
#    spread with clocks logged, ncu memory sections at non-causal seq 4096 / 16384 / 1024);
# 2. the hardware tanh's error (tanh_approx_error.cu, nvcc here), for the soft-cap's
#    accuracy question in docs/perf-notes.md.
set -uo pipefail
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
( cd /tmp && $NVCC -O3 -arch=sm_90a -o tanh_err "$OLDPWD/docs/results/s27/tanh_approx_error.cu" && ./tanh_err ) \
  2>&1 | tee $OUT/tanh-approx-error.md
echo "tanh scan done ($(( $(date +%s) - T0 )) s)"
bash docs/results/s26/next-d256-probe.sh
echo "call total $(( $(date +%s) - T0 )) s"
