"""Pools ab.sh's runs: each side's live downtime per event kind, median with a bootstrap 95% interval."""
import glob
import json
import random
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab-facts"


def ci(xs, n=2000, seed=0):
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n)]]


res = {}
for sc in ("reshape", "scale"):
    side = {}
    for s in ("old", "new"):
        xs = []
        for f in sorted(glob.glob(f"{out}/{s}-{sc}-*/report.json")):
            xs += [e["downtime_s"] for e in json.load(open(f))["events"] if e.get("status") == "done"]
        side[s] = xs
    res[sc] = {"old_events": len(side["old"]), "new_events": len(side["new"]),
               "old_median_s": statistics.median(side["old"]), "new_median_s": statistics.median(side["new"]),
               "old_ci95": ci(side["old"]), "new_ci95": ci(side["new"]),
               "ratio": statistics.median(side["new"]) / statistics.median(side["old"])}
print(json.dumps(res, indent=1))
