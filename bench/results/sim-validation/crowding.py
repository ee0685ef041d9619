"""The CPU profile's leave-one-out (validate.validate_cpu_handoffs) and held-out reconfig scores
with and without the crowding of processes on cores (costs.crowding), on the same events."""
import json
import statistics
from pathlib import Path

from liver.policy import costs
from liver.sim import calibrate, results, validate

root = Path("bench/results")
events = results.cpu_events(root)
held = results.cpu_reconfig_events(root)
base = {**calibrate.fit(*results.measurements(root))[0],
        **calibrate.fit_cpu(results.cpu_samples(root / "cpu-target-choice" / "target.json"))[0]}
real = costs.crowding
out = {}
for name, fn in (("with crowding", real), ("without crowding", lambda cores, procs: 1.0)):
    costs.crowding = fn
    loo = validate.validate_cpu_handoffs(events, base)
    ho = validate.validate_cpu_reconfig(held, events, base)
    row = {"leave_one_out_median": {q: s["median_abs_error"] for q, s in loo["summary"].items()}}
    for grp in ("x8", "x2"):
        sel = [r for r in loo["events"] if grp in r["event"].split(":")[0]]
        row[f"leave_one_out_median_{grp}"] = {q: statistics.median(abs(r[q]["error"]) for r in sel if q in r)
                                              for q in validate.QUANTITIES}
    for src in sorted({r["event"].split(":")[0] for r in ho["events"]}):
        sel = [r for r in ho["events"] if r["event"].startswith(src + ":")]
        row[f"held_out_median_{src}"] = {q: statistics.median(abs(r[q]["error"]) for r in sel if q in r)
                                         for q in validate.QUANTITIES}
    out[name] = row
costs.crowding = real
print(json.dumps(out, indent=1))
