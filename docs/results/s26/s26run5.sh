#!/usr/bin/env bash
# Session 26, device call 5 (the command as sent, inline): call 4's full verify timed out while
# it compiled its 741 kernels into a cold cache (120 s); run again on the warm machine, whose
# default cache then held them.
T0=$(date +%s); timeout 110 .device/bin/attnforge verify --backend cuda --suite full > $OUT/verify-full-2.log 2>&1; echo "exit $? ($(( $(date +%s) - T0 )) s)"; grep -c compiled $OUT/verify-full-2.log; tail -1 $OUT/verify-full-2.log
