# $1: checkout; $2: out dir; a scale-out to a bf16 FSDP2 pipeline and a reshape within, live, with digests
cd $1
printf 'at step 2: reshape 1,2,2\nat step +2: scale-out 8 as 1,2,4\n' > $2.events
PYTHONPATH=$1 OMP_NUM_THREADS=1 /work/main/.venv/bin/liver run --config configs/llama-native.toml --set checkpoint.every=0 --set parallel=2,1,2 --set gpus=4 --set agent.slots=8 --set job.compute_dtype=bfloat16 --events $2.events --steps 8 --digest --run-dir $2 > $2.log 2>&1
echo rc=$?
