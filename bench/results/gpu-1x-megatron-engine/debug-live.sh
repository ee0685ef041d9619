set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --root-user-action=ignore .whl/megatron_core-0.16.1-*.whl .whl/psutil-*.whl 2>&1 | tail -3
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -W ignore tests/test_megatron.py -k live_reshapes --basetemp /tmp/bt 2>&1 | grep -v -i "warn" | grep -E "^E |Error|error" | head -30 | tee $OUT/live-test.txt
grep -h -B2 -A12 Traceback /tmp/bt/*/*/logs/*.log 2>/dev/null | grep -v -i warn | head -60 > $OUT/live-logs.txt
