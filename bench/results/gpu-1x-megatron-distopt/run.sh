#!/usr/bin/env bash
# One H200 (the GPU image: torch 2.11, Python 3.12, no network): megatron-core 0.16.1's and psutil's cp312
# wheels carried in .whl/ (not committed), then
#  (1) the GPU-only Megatron tests: Megatron's DDP + distributed optimizer + schedule train, move and load back
#      exactly (fp32, bf16); its own sharded metadata at emulated sizes against LiveR's box table;
#  (2) the 1B job with Megatron's distributed optimizer (configs/megatron-gpu-1b-distopt.toml) and, beside it,
#      the same job on LiveR's own schedule and AdamW (configs/megatron-gpu-1b.toml), 12 steps each, world size 1;
#  (3) every Megatron test on this image.
set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name(0))" > $OUT/env.txt
python3 -m pip install -q --no-deps --root-user-action=ignore .whl/megatron_core-0.16.1-*.whl .whl/psutil-*.whl 2>&1 | tail -3 >> $OUT/env.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_megatron.py \
    -k "distributed_optimizer or gpu_adapter" --tb=short 2>&1 | grep -v "^  warnings.warn\|UserWarning\|DeprecationWarning" | tail -150 > $OUT/pytest-gpu.txt
printf '# no events: the job trains at world size 1\n' > /tmp/none.events
for cfg in megatron-gpu-1b-distopt megatron-gpu-1b; do
  timeout 240 python3 -m liver.cli run --config configs/$cfg.toml --events /tmp/none.events --steps 12 \
      --end-after-events -1 --run-dir /tmp/run-$cfg --set timeline=false 2>&1 | grep -v -i "warn" | tail -25 > $OUT/run-$cfg.txt
  cp /tmp/run-$cfg/steps.jsonl $OUT/steps-$cfg.jsonl 2>/dev/null
  [ -f /tmp/run-$cfg/steps.jsonl ] || tail -c 4000 /tmp/run-$cfg/logs/proc0.log >> $OUT/run-$cfg.txt 2>/dev/null
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_megatron.py 2>&1 | tail -8 > $OUT/pytest.txt
