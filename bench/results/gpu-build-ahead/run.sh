#!/usr/bin/env bash
# One H200 (torch 2.11): `liver bench build` (the engine's construction in the switch and the new engine's first
# step beyond its second), native against reference, at 1B or 8B (argument), three layouts; JSON into $OUT.
set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch; from liver.world import sharding; print('torch', torch.__version__, 'sharding table installed:', sharding.install())"
if [ "$1" = 1b ] || [ "$1" = both ]; then
  python3 -m liver.cli bench build --model 1b --repeats 3 --set job.train.micro_batch=1 --set job.model.vocab_size=50304 \
      --parallel 1,1,8 --parallel 2,1,4 --parallel 8,1,1 --json > $OUT/build-1b.json
fi
if [ "$1" = 8b ] || [ "$1" = both ]; then
  python3 -m liver.cli bench build --model 7b --repeats 3 --set job.train.micro_batch=1 --set job.model.ffn_size=14336 \
      --set job.model.vocab_size=128256 --parallel 1,1,8 --parallel 2,1,4 --parallel 8,1,1 --json > $OUT/build-8b.json
fi
echo rc=$?
