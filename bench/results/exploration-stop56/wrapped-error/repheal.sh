#!/bin/bash
# the replicated recipe (DDP's way) on tp2pp2dp2: a rank killed mid-step; the survivors must stall and heal (TP all-reduces
# inside the stages' forward, whose errors torch's pipelining wraps)
D=/tmp/repheal; rm -rf $D; mkdir -p $D; cd ${1:-/work/main}
printf '# none\n' > $D/none.txt
LIVER_FAULT=mid-step:7:5 OMP_NUM_THREADS=1 PYTHONPATH=${1:-/work/main} /work/main/.venv/bin/liver run --config configs/llama-native.toml --set checkpoint.every=0 --set agent.slots=8 --set engine=$PWD/tests/recipes/replicated.py:RECIPE --digest --set parallel=2,2,2 --set gpus=8 --events $D/none.txt --steps 9 --end-after-events -1 --run-dir $D/live > $D/live.log 2>&1
echo rc=$?
grep -E "no-heal|broke|heal|exited|fail-stop" $D/live.log | cut -c1-250 | head -12
