#!/bin/bash
# Issue 31 on nvidia-h200-x2 (not lent so far): Megatron-Core's 1.1B GPT (configs/megatron-gpu-1b-distopt.toml:
# Megatron's DDP, distributed optimizer and schedule, bf16) from one GPU to two and back through TP2 and two
# pipeline stages (configs/megatron-gpu-x2.events), live, then the same changes by Megatron's own checkpoint-
# restart; each run under 10 minutes, results under $OUT.
#   RUN=1 bash bench/gpu/megatron-x2.sh   live
#   RUN=2 bash bench/gpu/megatron-x2.sh   restart through dist_checkpointing (the baseline)
# Dry run on CPU (the same events on configs/megatron.toml's model and the CPU engine, gloo):
#   DRY=1 bash bench/gpu/megatron-x2.sh   (bench/results/cpu-megatron-x2-dryrun)
set -u
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LIVER="python3 -m liver.cli"
EVENTS=configs/megatron-gpu-x2.events
if [ -n "${DRY:-}" ]; then
  JOB=(--config configs/megatron.toml --gpus 1 --parallel 1,1,1 --slots 2 --backend gloo)
else
  JOB=(--config configs/megatron-gpu-1b-distopt.toml --gpus 1 --slots 2)
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/versions.txt" 2>&1
fi
case "${RUN:-1}" in
  1) MODE=live ;;
  2) MODE=restart ;;
esac
timeout 570 $LIVER run "${JOB[@]}" --events "$EVENTS" --end-after-events 3 --steps 100000 --mode "$MODE" \
    --run-dir /dev/shm/megatron-x2-$MODE --set timeline=false > "$OUT/run-$MODE.log" 2>&1
echo "rc=$?" >> "$OUT/run-$MODE.log"
cp /dev/shm/megatron-x2-$MODE/report.json "$OUT/report-$MODE.json" 2>/dev/null
