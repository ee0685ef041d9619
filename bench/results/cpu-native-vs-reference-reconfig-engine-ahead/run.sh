# The three events of cpu-native-vs-reference-reconfig on a user's model and on the reference engine, each there
# and back four times a run (--cycles 4), the two engines' runs interleaved, three rounds; from a clone of the
# commit under test in $SNAP (default /tmp/snap), JSON in $OUT (default here), the runs' folders in $RUNS
# (default /tmp/bpair3).
SNAP=${SNAP:-/tmp/snap}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE}
RUNS=${RUNS:-/tmp/bpair3}
cd "$SNAP"
export PYTHONPATH=$SNAP OMP_NUM_THREADS=1
for i in 1 2 3; do
  for w in native reference; do
    /work/main/.venv/bin/python -m liver.cli bench reconfig --workload configs/llama-$w.toml --json --repeats 1 \
        --cycles 4 --run-dir $RUNS/$w-$i > "$OUT/bpair-$w-$i.json" 2> "$OUT/bpair-$w-$i.err"
  done
done
python3 "$HERE/summarise.py" "$OUT"
