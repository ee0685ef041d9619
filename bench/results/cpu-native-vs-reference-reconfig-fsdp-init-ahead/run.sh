# As ../cpu-native-vs-reference-reconfig-engine-ahead/run.sh (the three events of cpu-native-vs-reference-reconfig
# on a user's model and on the reference engine, each there and back four times a run, the two engines' runs
# interleaved, three rounds), on a later commit: from a clone of it in $SNAP (default /tmp/snap), JSON here;
# summary.json and events.json by that folder's summarise.py and events.py.
SNAP=${SNAP:-/tmp/snap}
HERE=$(cd "$(dirname "$0")" && pwd)
PREV=$HERE/../cpu-native-vs-reference-reconfig-engine-ahead
cd "$SNAP"
export PYTHONPATH=$SNAP OMP_NUM_THREADS=1
rm -rf /tmp/bpair4
for i in 1 2 3; do
  for w in native reference; do
    /work/main/.venv/bin/python -m liver.cli bench reconfig --workload configs/llama-$w.toml --json --repeats 1 \
        --cycles 4 --run-dir /tmp/bpair4/$w-$i > "$HERE/bpair-$w-$i.json" 2> "$HERE/bpair-$w-$i.err"
  done
done
python3 "$PREV/summarise.py" "$HERE"
python3 "$PREV/events.py" /tmp/bpair4 "$HERE"
