#!/bin/bash
# liver bench host-start on the lent GPU machine: k fresh processes of one host started together
# (imports, CUDA context, a 512 MiB shard each read from the root disk with its page cache evicted,
# copied to the GPU), k = 1, 2, 4, 8, three interleaved runs each. Writes under $OUT.
set -e
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
mkdir -p "$PWD/.host-start"
df -h "$PWD/.host-start" /tmp /dev/shm > "$OUT/disk.txt" 2>&1 || true
nproc > "$OUT/cpus.txt"
python -c "import torch, sys; print(torch.__version__, sys.version.split()[0])" > "$OUT/versions.txt"
python -m liver.cli bench host-start --procs 1,2,4,8 --read-mib 512 --repeats 3 --run-dir "$PWD/.host-start" \
    --out "$OUT/host_start.json" > "$OUT/stdout.txt" 2>&1
