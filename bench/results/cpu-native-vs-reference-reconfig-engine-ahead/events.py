"""events.json (or DIR/events.json) from the live runs' reports under RUNS (the run dirs that
``run.sh`` leaves in /tmp): every live event's own figures, and their medians per scenario, new
layout and engine (ms): downtime, its pause and first-step extra, the switch, its build, the
transfer. Usage: python3 events.py RUNS [DIR]."""
import json
import statistics
import sys
from pathlib import Path

runs, here = Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent
KEYS = ("downtime_s", "pause_s", "first_step_extra_s", "switch_s", "build_s", "transfer_s")
events, groups = [], {}
for rep in sorted(runs.glob("*-*/s*-live-*/report.json")):
    engine, scenario = rep.parent.parent.name.split("-")[0], int(rep.parent.name[1])
    for e in json.loads(rep.read_text())["events"]:
        if "downtime_s" in e:
            row = {"engine": engine, "scenario": scenario, "old": e["old"], "new": e["new"], "run": str(rep.parent),
                   **{k: e.get(k, 0.0) for k in KEYS}}
            events.append(row)
            groups.setdefault((scenario, e["new"], engine), []).append(row)
medians = [{"scenario": s, "new": new, "engine": w, "n": len(rows),
            **{k[:-2] + "_ms": 1e3 * statistics.median(r[k] for r in rows) for k in KEYS}}
           for (s, new, w), rows in sorted(groups.items())]
(here / "events.json").write_text(json.dumps({"medians": medians, "events": events}, indent=1) + "\n")
for m in medians:
    print(m["scenario"], m["new"], m["engine"], m["n"], " ".join(f"{k} {m[k]:.2f}" for k in m if k.endswith("_ms")))
