cd /tmp/snap
export PYTHONPATH=/tmp/snap OMP_NUM_THREADS=1
for i in 1 2 3 4; do
  for w in native reference; do
    /work/main/.venv/bin/python -m liver.cli bench reconfig --workload configs/llama-$w.toml --json --repeats 1 --cycles 1 --run-dir /tmp/bpair/$w-$i > /tmp/bpair-$w-$i.json 2>/tmp/bpair-$w-$i.err
  done
done
echo done > /tmp/bpair.done
