# The three events of cpu-native-vs-reference-reconfig on a user's model and on the reference engine, each there
# and back four times a run (--cycles 4), the two engines' runs interleaved, three rounds; from a clone of the
# commit under test in $SNAP (default /tmp/snap), JSON here.
SNAP=${SNAP:-/tmp/snap}
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$SNAP"
export PYTHONPATH=$SNAP OMP_NUM_THREADS=1
for i in 1 2 3; do
  for w in native reference; do
    /work/main/.venv/bin/python -m liver.cli bench reconfig --workload configs/llama-$w.toml --json --repeats 1 \
        --cycles 4 --run-dir /tmp/bpair3/$w-$i > "$HERE/bpair-$w-$i.json" 2> "$HERE/bpair-$w-$i.err"
  done
done
python3 "$HERE/summarise.py" "$HERE"
