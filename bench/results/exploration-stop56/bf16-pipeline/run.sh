#!/bin/bash
# A user's model in bf16 through pipeline layouts, live, then restart-forked at the same cuts: every step's loss and digest.
set -e
D=/tmp/bf16lr; rm -rf $D; mkdir -p $D; cd /work/main
L=".venv/bin/liver run --config configs/llama-native.toml --set checkpoint.every=0 --set agent.slots=4 --set job.compute_dtype=bfloat16 --digest"
printf 'at step 3: reshape 1,2,2\nat step +3: scale-in 2 as 1,2,1\nat step +3: scale-out 4 as 2,2,1\nat step +3: reshape 1,1,4\n' > $D/events.txt
OMP_NUM_THREADS=1 $L --set parallel=2,1,2 --set gpus=4 --events $D/events.txt --steps 100000 --end-after-events 3 --run-dir $D/live > $D/live.log 2>&1
python3 - <<'PY'
import json
r=json.load(open('/tmp/bf16lr/live/report.json'))
ev=[("reshape 1,2,2"),("scale-in 2 as 1,2,1"),("scale-out 4 as 2,2,1"),("reshape 1,1,4")]
cuts=[e["last_old_step"] for e in r["events"]]
print([(e["new"], e["status"], e.get("digest_equal")) for e in r["events"]])
open('/tmp/bf16lr/events2.txt','w').write("".join(f"at step {c}: {a}\n" for c,a in zip(cuts,ev)))
open('/tmp/bf16lr/total','w').write(str(r["steps"][-1]["step"]))
PY
OMP_NUM_THREADS=1 $L --set parallel=2,1,2 --set gpus=4 --events $D/events2.txt --steps $(cat $D/total) --mode restart-forked --run-dir $D/restart > $D/restart.log 2>&1
python3 - <<'PY'
import json
a=json.load(open('/tmp/bf16lr/live/report.json')); b=json.load(open('/tmp/bf16lr/restart/report.json'))
ka=[(s["step"],s["parallel"],s["loss"],s.get("grad_norm"),s.get("digest")) for s in a["steps"]]
kb=[(s["step"],s["parallel"],s["loss"],s.get("grad_norm"),s.get("digest")) for s in b["steps"]]
print("steps", len(ka), "equal", ka==kb, "layouts", sorted({k[1] for k in ka}))
PY
