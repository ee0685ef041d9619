#!/bin/bash
# liver bench rendezvous on the lent GPU machine (16 cores; torch 2.11's TCPStore): N ranks (a thread each over 8
# worker processes) rendezvous through one store on loopback, N = 8 to 512, three interleaved runs each. Under $OUT.
set -e
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
python -c "import torch, sys; print(torch.__version__, sys.version.split()[0])" > "$OUT/versions.txt"
nproc > "$OUT/cpus.txt"
sysctl net.core.somaxconn net.ipv4.tcp_max_syn_backlog > "$OUT/sysctl.txt" 2>&1 || true
timeout 500 python -m liver.cli bench rendezvous --ranks 8,16,24,32,64,128,256,512 --procs 8 --repeats 3 \
    --out "$OUT/rendezvous.json" > "$OUT/stdout.txt" 2>&1
