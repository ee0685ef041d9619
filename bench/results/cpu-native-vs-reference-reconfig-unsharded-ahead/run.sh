# As ../cpu-native-vs-reference-reconfig-engine-ahead/run.sh (the three events of cpu-native-vs-reference-reconfig
# on a user's model and on the reference engine, each there and back four times a run, the two engines' runs
# interleaved, three rounds), on a later commit: from a clone of it in $SNAP (default /tmp/snap), JSON here;
# summary.json and events.json by that folder's summarise.py and events.py.
HERE=$(cd "$(dirname "$0")" && pwd)
PREV=$HERE/../cpu-native-vs-reference-reconfig-engine-ahead
rm -rf /tmp/bpair5
OUT=$HERE RUNS=/tmp/bpair5 bash "$PREV/run.sh"
python3 "$PREV/events.py" /tmp/bpair5 "$HERE"
