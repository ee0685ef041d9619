#!/bin/bash
cd /work/main
python3 -c "while True: pass" & busy=$!
for i in $(seq 1 ${N:-30}); do
  rm -rf /tmp/rq$i
  OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -m pytest -q -x tests/test_fence.py -k frozen_agents --basetemp=/tmp/rq$i > /tmp/rep/out$i 2>&1
  res=$(tail -1 /tmp/rep/out$i)
  cut=$(grep -h "connections cut" /tmp/rq$i/*/run/logs/proc*.log 2>/dev/null | sed 's/.*; //' | tr '\n' ' ')
  ab=$(grep -l "collective abandoned" /tmp/rq$i/*/run/logs/proc*.log 2>/dev/null | wc -l)
  kinds=$(grep -o '"kind": "[a-z-]*", "outcome": "[a-z-]*"' /tmp/rq$i/*/run/report.json 2>/dev/null | tr '\n' ' ')
  echo "run $i: $res | $cut | abandoned-in-logs=$ab | $kinds" >> /tmp/rep/outcomes.txt
done
kill $busy
