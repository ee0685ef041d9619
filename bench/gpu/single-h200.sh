#!/bin/bash
# One call on the lent single-H200 machine (the GPU image: torch 2.11, NCCL 2.28), results under $OUT:
# 1. the user's-model (pipeline stages included) in-process tests on this torch;
# 2. configs/llama-native.toml's five live reshapes (TP2 -> FSDP2 -> FSDP2 x TP2 -> FSDP4 -> TP2 -> PP2)
#    over gloo on this torch, digests checked at every handoff;
# 3. liver bench dcp on the GPU: step times of the 1B and 3B configurations on one device, DCP save and
#    load of their whole training state to local disk and to /dev/shm (issue 19, item 4).
#   bash bench/gpu/single-h200.sh     (OUT defaults to ./out-gpu)
set -u
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LIVER="python3 -m liver.cli"
{ python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], 'nccl', torch.cuda.nccl.version())"
  nproc; python3 -c "import os; print('affinity', len(os.sched_getaffinity(0)))"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  df -h /tmp /dev/shm; } > "$OUT/versions.txt" 2>&1
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_native.py -k 'not live_reshapes and not kill9' > "$OUT/pytest-native.log" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest-native.log"
timeout 100 $LIVER run --config configs/llama-native.toml --run-dir /tmp/r1 > "$OUT/run-gloo.log" 2>&1
echo "run rc=$?" >> "$OUT/run-gloo.log"; cp /tmp/r1/report.json "$OUT/report-gloo.json"
for m in "1b 2 200" "3b 2 240"; do set -- $m
  timeout $3 $LIVER bench dcp --backend nccl --model $1 --dir /tmp --dir /dev/shm --repeats $2 --out "$OUT/dcp-$1" > "$OUT/dcp-$1.log" 2>&1
  echo "dcp rc=$?" >> "$OUT/dcp-$1.log"
done
