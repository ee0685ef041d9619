#!/usr/bin/env bash
# One H200 (the GPU image: torch 2.11, Python 3.12, no network): megatron-core 0.16.1's and psutil's cp312
# wheels carried in .whl/ (not committed), then (1) the 1B Megatron job of configs/megatron-gpu-1b.toml trained
# at world size 1 on the GPU, its step lines (MFU) kept; (2) this session's Megatron tests on this image.
set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name(0))"
python3 -m pip install -q --no-deps --root-user-action=ignore .whl/megatron_core-0.16.1-*.whl .whl/psutil-*.whl 2>&1 | tail -3
printf '# no events: the job trains at world size 1\n' > /tmp/none.events
timeout 420 python3 -m liver.cli run --config configs/megatron-gpu-1b.toml --events /tmp/none.events --steps 12 \
    --end-after-events -1 --run-dir /tmp/run-1b --set timeline=false 2>&1 | grep -v -i "warn" | tail -25 | tee $OUT/run-1b.txt
cp /tmp/run-1b/report.json /tmp/run-1b/steps.jsonl $OUT/ 2>/dev/null; tail -c 3000 /tmp/run-1b/logs/proc0.log > $OUT/proc0-tail.txt 2>/dev/null
timeout 150 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_megatron.py 2>&1 | tail -8 | tee $OUT/pytest.txt
