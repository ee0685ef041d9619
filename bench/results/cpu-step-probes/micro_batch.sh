#!/bin/bash
# Median step time of a tp2 job at micro batch 1 and 2, interleaved (20-25 steps, no events), per job file.
set -u
printf '# none\n' > /tmp/none.events
for cfg in megatron llama-native; do for mb in 1 2 1 2; do
  rm -rf /tmp/mbprobe
  liver run --config configs/$cfg.toml --steps 20 --events /tmp/none.events --end-after-events -1 --run-dir /tmp/mbprobe \
      --digest switch --set timeline=false --set checkpoint.every=0 --parallel 2,1,1 --gpus 2 --set job.train.micro_batch=$mb > /dev/null 2>&1
  python -c "
import json, statistics
st = json.load(open('/tmp/mbprobe/report.json'))['steps']
print(json.dumps({'config': '$cfg', 'micro_batch': $mb, 'median_step_s': round(statistics.median(s['step_s'] for s in st), 4)}))"
done; done
