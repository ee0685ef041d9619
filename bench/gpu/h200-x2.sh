#!/bin/bash
# Issue 19 on nvidia-h200-x2 (not lent so far): one call per run, each under 10 minutes, results under $OUT.
#   RUN=1 bash bench/gpu/h200-x2.sh   the reference engine at 1B: x2-twice (scale-out with a cold process,
#                                     tp2 -> dp2, scale-in by deadline, each twice), live and restart; p2p first
#   RUN=2 bash bench/gpu/h200-x2.sh   the DTensor example at 1B: x2-native (TP2 on a cold joiner, TP2 -> FSDP2,
#                                     FSDP2 -> TP2, scale-in by deadline), live and restart
#   RUN=3 bash bench/gpu/h200-x2.sh   two agents (a GPU each) under one controller: node1's notice, its return
#   RUN=4 bash bench/gpu/h200-x2.sh   3B: x2 live and restart (step times, group creation in each event's
#                                     prepare record); then liver sim validate beside the new runs
# Dry runs of 1-3 on CPU: bench/results/cpu-x2-native-dryrun, cpu-x2-nodes-dryrun (and the x2 test in tests/).
set -u
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LIVER="python3 -m liver.cli"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/versions.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" >> "$OUT/versions.txt"
case "${RUN:-1}" in
  1) timeout 570 $LIVER bench handoffs --scenario x2-twice --model 1b --run-root /dev/shm --out "$OUT" > "$OUT/run.log" 2>&1 ;;
  2) timeout 570 $LIVER bench handoffs --scenario x2-native --model 1b --engine examples/llama.py:RECIPE --set job.model.vocab_size=50304 \
       --run-root /dev/shm --out "$OUT" > "$OUT/run.log" 2>&1 ;;
  3) timeout 570 $LIVER bench nodes --model 1b --backend nccl --out /dev/shm/nodes > "$OUT/run.log" 2>&1
     cp /dev/shm/nodes/nodes.json "$OUT/" ;;
  4) timeout 570 $LIVER bench handoffs --scenario x2 --model 3b --run-root /dev/shm --out "$OUT" > "$OUT/run.log" 2>&1 ;;
esac
echo "rc=$?" >> "$OUT/run.log"
