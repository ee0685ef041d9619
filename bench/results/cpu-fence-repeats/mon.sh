#!/bin/bash
cd /work/main
for i in $(seq 1 ${N:-12}); do
  rm -rf /tmp/rp$i
  (OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -m pytest -q -x tests/test_fence.py -k frozen_agents --basetemp=/tmp/rp$i > /tmp/rep/out$i 2>&1) &
  tp=$!
  dumped=0; seen=0
  while kill -0 $tp 2>/dev/null; do
    c=$(ls /tmp/rp$i/*/run/controller.log 2>/dev/null | head -1)
    if [ -n "$c" ] && [ $dumped = 0 ] && grep -q node-lost $c; then
      if grep -q -E 'phase": "heal' $c; then dumped=2; else
        seen=$((seen+1))
        if [ $seen -gt 8 ]; then
          for p in $(pgrep -f "spawn_main|liver.runtime"); do kill -USR1 $p; done; dumped=1; echo "dumped run $i"
        fi
      fi
    fi
    sleep 1
  done
  tail -1 /tmp/rep/out$i
done
