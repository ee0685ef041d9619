#!/bin/bash
# On the lent single-H200 machine (the GPU image: torch 2.11, NCCL 2.28), results under $OUT, for the
# simulator's calibration and its held-out checks (issue 17); one call each:
#   PART=1: liver bench dcp on the GPU, 1B: its one-device step, DCP save and load of its whole state to
#           local disk and /dev/shm (three repeats: the same measurement as gpu-1x-native-pp-compat, a
#           session apart), and the device's local copy bandwidth (the transfer model's copy term);
#   PART=2: one-device steps of shapes beyond the presets (the 1B's layers at hidden sizes 1024 and 1536,
#           8 layers at 4096), held out from the step-time model's fit (its share of the peak against the
#           width of the matrix multiplies), with their DCP to /dev/shm.
#   PART=1 bash bench/gpu/h200-sim.sh     (OUT defaults to ./out-gpu)
set -u
OUT=${OUT:-out-gpu}; PART=${PART:-1}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LIVER="python3 -m liver.cli"
{ python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], 'nccl', torch.cuda.nccl.version())"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; free -g; df -h /tmp /dev/shm; } > "$OUT/versions.txt" 2>&1
if [ "$PART" = 1 ]; then
  timeout 240 $LIVER bench dcp --backend nccl --model 1b --dir /tmp --dir /dev/shm --repeats 3 --out "$OUT/dcp-1b" > "$OUT/dcp-1b.log" 2>&1
  echo "dcp rc=$?" >> "$OUT/dcp-1b.log"
else
  for shape in "h1024 1024 8 2816 16" "h1536 1536 12 4224 16" "h4096 4096 32 11008 8"; do set -- $shape
    timeout 170 $LIVER bench dcp --backend nccl --model 1b --set job.model.hidden_size=$2 --set job.model.num_heads=$3 \
      --set job.model.ffn_size=$4 --set job.model.num_layers=$5 --dir /dev/shm --repeats 2 --out "$OUT/dcp-$1" \
      > "$OUT/dcp-$1.log" 2>&1
    echo "dcp rc=$?" >> "$OUT/dcp-$1.log"
  done
fi
