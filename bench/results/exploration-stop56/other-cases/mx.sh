#!/bin/bash
# megatron: $1 name $2 fault $3 parallel $4 gpus $5 events
D=/tmp/mx-$1; rm -rf $D; mkdir -p $D; cd /work/main
printf "$5" > $D/events.txt
LIVER_FAULT=$2 OMP_NUM_THREADS=1 timeout 300 .venv/bin/liver run --config configs/megatron.toml --set checkpoint.every=3 --set agent.slots=4 --digest --set parallel=$3 --set gpus=$4 --events $D/events.txt --steps ${STEPS:-14} --end-after-events -1 --run-dir $D/live > $D/live.log 2>&1
echo "$1 rc=$?"
python3 - "$D" <<'PY'
import json, sys
r=json.load(open(sys.argv[1]+'/live/report.json'))
for e in r["events"]: print(" ", {k:e.get(k) for k in ("event","status","new","restored_step","lost_steps","digest_equal")})
st=[s["step"] for s in r["steps"]]; print("  steps", st[-1], "gens", sorted({s["generation"] for s in r["steps"]}))
PY
