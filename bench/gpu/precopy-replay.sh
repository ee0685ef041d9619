#!/usr/bin/env bash
# One H200 (the GPU image: torch 2.11, Python 3.12): a pre-copy's replay of an optimizer update on cut shards,
# against the engine's own update on the whole tensors, bit for bit, on the GPU (and on its CPU beside it):
#  (1) tests/test_precopy.py -k cut_shards: the reference engine (fp32, bf16 compute) and a recipe's SGD
#      (momentum), Adagrad, NAdam and fused AdamW; on CUDA fused AdamW must replay exactly (on a CPU it is refused);
#  (2) liver.engine.shard_invariance.report for the three AdamW forms on CUDA, fp32 and bf16.
set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name(0))" > $OUT/env.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_precopy.py -k cut_shards -rA --tb=short 2>&1 \
    | grep -v "^  warnings.warn\|UserWarning\|DeprecationWarning" | tail -60 > $OUT/pytest-replay.txt
timeout 120 python3 -c "
import json, torch
from liver.engine.shard_invariance import report
print(json.dumps({str(d): report('cuda', d) for d in (torch.float32, torch.bfloat16)}, indent=1))" > $OUT/invariance-cuda.json 2>&1
