#!/usr/bin/env bash
# One H200 (torch 2.11): `liver bench build` with the whole native engine made in Prepare (model, storage,
# optimizer and its state; the switch takes it): the build left in the switch and the first step's extra, native
# against reference, at 1B and 8B shapes, three layouts each; JSON and stderr into $OUT. Each size under its own
# time limit (argument: seconds per size). At 8B the steps' batch is 8 x 1,024 tokens (the preset's 16 x 2,048
# ran out of memory in the steps: their activations on one rank of a mock world).
set -u
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
limit=${1:-250}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
/usr/bin/time -f "1b: %e s" timeout $limit python3 -m liver.cli bench build --model 1b --repeats ${REPEATS:-3} \
    --set job.train.micro_batch=1 --set job.model.vocab_size=50304 \
    --parallel 1,1,8 --parallel 2,1,4 --parallel 8,1,1 --json > $OUT/build-1b.json 2> $OUT/build-1b.err
echo "1b rc=$?"; tail -3 $OUT/build-1b.err
/usr/bin/time -f "8b: %e s" timeout $limit python3 -m liver.cli bench build --model 7b --repeats ${REPEATS:-3} \
    --set job.train.micro_batch=1 --set job.model.ffn_size=14336 --set job.model.vocab_size=128256 \
    --set job.train.global_batch=8 --set job.model.seq_len=1024 \
    --parallel 1,1,8 --parallel 2,1,4 --parallel 8,1,1 --json > $OUT/build-8b.json 2> $OUT/build-8b.err
echo "8b rc=$?"; tail -5 $OUT/build-8b.err
