#!/bin/bash
cd /work/main
python3 -c "while True: pass" & busy=$!
python3 /tmp/exp/dnsburst.py & dns=$!
for i in $(seq 1 ${N:-40}); do
  rm -rf /tmp/hq$i
  (OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -m pytest -q -x tests/test_fence.py -k frozen_agents --basetemp=/tmp/hq$i > /tmp/rep/hout$i 2>&1) &
  tp=$!; dumped=0; seen=0
  while kill -0 $tp 2>/dev/null; do
    c=$(ls /tmp/hq$i/*/run/controller.log 2>/dev/null | head -1)
    if [ -n "$c" ] && [ $dumped = 0 ] && grep -q node-lost $c; then
      if grep -q -E '"phase": "(heal|no-heal)' $c; then dumped=2; else
        seen=$((seen+1))
        if [ $seen -gt 10 ]; then
          for p in $(python3 -c "
import json,glob
for f in glob.glob('/tmp/hq$i/*/run/procs-*.json'):
    for r in json.load(open(f)):
        if r['alive']: print(r['pid'])"); do echo "=== pid $p"; .venv/bin/py-spy dump --pid $p 2>&1; done > /tmp/rep/hdump$i.txt
          dumped=1; echo "dumped run $i" >> /tmp/rep/hunt.txt
        fi
      fi
    fi
    sleep 0.5
  done
  echo "run $i: $(tail -1 /tmp/rep/hout$i)" >> /tmp/rep/hunt.txt
  if [ $dumped = 1 ]; then break; fi
done
kill $busy $dns
