"""switches.json from the live runs' own reports (the run directories that the JSON beside this
names): per run, the event's downtime, the switch itself, the build left in it, and the new
generation's first step beyond the median of its next ten."""
import json
import statistics
from pathlib import Path

here = Path(__file__).parent
out = []
for f in sorted(here.glob("bpair-*-*.json")):
    engine = f.stem.split("-")[1]
    for row in json.loads(f.read_text()):
        live = [d for d in row["run_dirs"] if "-live-" in d][0]
        rep = json.loads((Path(live) / "report.json").read_text())
        e = rep["events"][0]
        new = [s for s in rep["steps"] if s["step"] > e["last_old_step"]][:11]
        out.append({"engine": engine, "run": f.stem, "scenario": row["scenario"], "downtime_s": e["downtime_s"],
                    "switch_s": e["switch_s"], "build": e.get("build"), "build_s": e.get("build_s"),
                    "first_step_s": new[0]["step_s"], "next_steps_median_s": statistics.median(s["step_s"] for s in new[1:]),
                    "first_step_extra_s": new[0]["step_s"] - statistics.median(s["step_s"] for s in new[1:])})
(here / "switches.json").write_text(json.dumps(out, indent=1) + "\n")
for r in out:
    print(r["engine"], r["scenario"][:24], *(f"{k}={r[k]:.3f}" for k in ("downtime_s", "switch_s", "build_s", "first_step_extra_s")))
