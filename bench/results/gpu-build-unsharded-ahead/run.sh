#!/usr/bin/env bash
# One H200 (torch 2.11): `liver bench build` at this commit (FSDP2's unsharded parameters made in Prepare) at
# 1B and 8B, three layouts each; then at 8B tp2pp1dp4, the commit before it (a copy in snap-prev/) and this one,
# interleaved twice: the first step's extra, with and without. JSON and stderr into $OUT.
set -u
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
R=${REPEATS:-5}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
B1="--model 1b --set job.train.micro_batch=1 --set job.model.vocab_size=50304"
B8="--model 7b --set job.train.micro_batch=1 --set job.model.ffn_size=14336 --set job.model.vocab_size=128256 \
    --set job.train.global_batch=8 --set job.model.seq_len=1024"
build() {  # code-dir name args...
  local dir=$1 name=$2; shift 2
  ( cd "$dir" && PYTHONPATH=$PWD /usr/bin/time -f "$name: %e s" timeout 200 python3 -m liver.cli bench build \
      --repeats $R "$@" --json > $OUT/$name.json 2> $OUT/$name.err ); echo "$name rc=$?"; tail -n 1 $OUT/$name.err
}
build . build-1b $B1 --parallel 1,1,8 --parallel 2,1,4 --parallel 8,1,1
build . build-8b $B8 --parallel 1,1,8 --parallel 2,1,4 --parallel 8,1,1
for i in 1 2; do
  build snap-prev prev-8b-tp2dp4-$i $B8 --parallel 2,1,4
  build . this-8b-tp2dp4-$i $B8 --parallel 2,1,4
done
