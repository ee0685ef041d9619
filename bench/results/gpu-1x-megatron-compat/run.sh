#!/usr/bin/env bash
# One H200 (the GPU image: torch 2.11, Python 3.12, no network): megatron-core 0.16.1's cp312 wheel (carried in
# wheels312/, not committed) installed, then this session's Megatron tests (the Resource View at emulated sizes,
# TP=2 over gloo on the CPU path, the flat ranges) and the native engine's prebuild tests, on this image's torch.
set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
python3 -m pip install -q --no-deps --root-user-action=ignore wheels312/megatron_core-0.16.1-*.whl 2>&1 | tail -3
python3 -c "import packaging, numpy; import megatron.core as m; print('megatron-core', m.__version__)" 2>&1 | tail -1
python3 -m pytest -q -p no:cacheprovider tests/test_megatron.py tests/test_layering.py \
    "tests/test_native.py::test_the_first_steps_sharding_is_worked_out_in_the_companion_and_changes_nothing" \
    "tests/test_native.py::test_the_engine_prebuilt_in_another_thread_is_the_one_the_switch_would_build" \
    2>&1 | tail -15 | tee $OUT/pytest.txt
