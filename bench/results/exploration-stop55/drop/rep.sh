#!/bin/bash
# one run; if the heal has not come 3 s after the drop, dump every live worker's stacks
i=$1; d=/tmp/ex55/rr$i; rm -rf $d
timeout 300 .venv/bin/python -m liver.cli run --config configs/megatron.toml --gpus 2 --slots 4 --set parallel=1,1,2 --events bench/results/exploration-stop55/drop/events.txt --digest switch --end-after-events 4 --steps 100 --ckpt-every 5 --run-dir $d > $d.log 2>&1 &
for k in $(seq 1 200); do sleep 0.3; grep -q '"phase": "drop"' $d.log 2>/dev/null && break; done
sleep 4
if grep -q '"healed"' $d.log; then echo "run $i: healed"; else
  echo "run $i: NOT healed after 4 s"; 
  python3 -c "
import json; [print(p['proc'], p['pid']) for p in json.load(open('$d/procs.json')) if p['alive']]" | while read p pid; do echo "--- proc $p pid $pid"; .venv/bin/py-spy dump --pid $pid 2>&1 | grep -v "^ *$" | head -40; done > $d.stacks
fi
wait
grep -E "^ *[0-9] " $d.log | cut -c1-200
