#!/bin/bash
# One call on the lent single-H200 machine (the GPU image: torch 2.11, NCCL 2.28), results under $OUT,
# for the simulator's calibration (issue 17):
# 1. liver bench dcp on the GPU, 1B: its one-device step, DCP save and load of its whole state to
#    local disk and /dev/shm (three repeats: the same measurement as gpu-1x-native-pp-compat, a session apart: how much
#    it moves between sessions), and the device's local copy bandwidth (a shard that stays on its
#    process in another box: the transfer model's copy term);
#   bash bench/gpu/h200-sim.sh     (OUT defaults to ./out-gpu)
set -u
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LIVER="python3 -m liver.cli"
{ python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], 'nccl', torch.cuda.nccl.version())"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; free -g; df -h /tmp /dev/shm; } > "$OUT/versions.txt" 2>&1
timeout 240 $LIVER bench dcp --backend nccl --model 1b --dir /tmp --dir /dev/shm --repeats 3 --out "$OUT/dcp-1b" > "$OUT/dcp-1b.log" 2>&1
echo "dcp rc=$?" >> "$OUT/dcp-1b.log"
