#!/bin/bash
cd /work/main
python3 -c "while True: pass" & busy=$!
.venv/bin/python /tmp/exp/dnsburst.py > /dev/null 2>&1 & dns=$!
for i in $(seq 1 ${N:-40}); do
  rm -rf /tmp/hr$i
  OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -m pytest -q -x tests/test_fence.py -k "frozen_agents or workers_stop" --basetemp=/tmp/hr$i > /tmp/rep/h2out$i 2>&1
  echo "run $i: $(tail -1 /tmp/rep/h2out$i) $(grep -l 'not stalled' /tmp/hr$i/*/run/logs/*.log 2>/dev/null | tr '\n' ' ')" >> /tmp/rep/hunt2.txt
  if grep -q "not stalled\|failed" /tmp/rep/h2out$i /tmp/hr$i/*/run/logs/*.log 2>/dev/null; then break; fi
done
kill $busy $dns
