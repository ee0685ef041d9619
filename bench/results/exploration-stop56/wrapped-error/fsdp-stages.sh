#!/bin/bash
# bf16 FSDP2 pipeline (1,2,2): a rank killed mid-step -> heal from replicas; then the same via restart-forked at the cut.
D=/tmp/bf16heal; rm -rf $D; mkdir -p $D; cd /work/main
printf '# none\n' > $D/none.txt
L=".venv/bin/liver run --config configs/llama-native.toml --set checkpoint.every=0 --set agent.slots=4 --set job.compute_dtype=bfloat16 --digest"
LIVER_FAULT=mid-step:3:5 OMP_NUM_THREADS=1 $L --set parallel=1,2,2 --set gpus=4 --events $D/none.txt --steps 10 --end-after-events -1 --run-dir $D/live > $D/live.log 2>&1
echo rc=$?
python3 - <<'PY'
import json
r=json.load(open('/tmp/bf16heal/live/report.json'))
for e in r["events"]: print({k:e.get(k) for k in ("event","status","new","restored_step","lost_steps","digest_equal","left_out")})
print([(s["step"], s["parallel"], round(s["loss"],5)) for s in r["steps"]])
PY
