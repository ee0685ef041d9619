#!/bin/bash
# hunt2.sh after the parking fix (110b30a): the same two tests beside the same stressors; each run's line names the
# worker logs that parked a communicator (a collective the cut did not wake) or dumped stacks (the watchdog).
cd /work/main
mkdir -p /tmp/rep
python3 -c "while True: pass" & busy=$!
.venv/bin/python bench/results/cpu-fence-repeats/dnsburst.py > /dev/null 2>&1 & dns=$!
for i in $(seq 1 ${N:-40}); do
  rm -rf /tmp/hr$i
  OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -m pytest -q -x -p no:cacheprovider tests/test_fence.py -k "frozen_agents or workers_stop" --basetemp=/tmp/hr$i > /tmp/rep/h3out$i 2>&1
  echo "run $i: $(tail -1 /tmp/rep/h3out$i) parked: $(grep -l 'parked' /tmp/hr$i/*/run/logs/*.log 2>/dev/null | tr '\n' ' ') stacks: $(grep -l 'Timeout (' /tmp/hr$i/*/run/logs/*.log 2>/dev/null | tr '\n' ' ')" >> /tmp/rep/hunt3.txt
  if grep -q "failed" /tmp/rep/h3out$i; then break; fi
done
kill $busy $dns
