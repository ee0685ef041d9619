"""summary.json from the interleaved runs beside it (or in the folder given: python3 summarise.py DIR):
per scenario, each engine's live downtime (median over the runs) and the native one over the
reference one."""
import json
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
runs = {w: [json.loads(p.read_text()) for p in sorted(here.glob(f"bpair-{w}-*.json"))] for w in ("native", "reference")}
out = []
for i, row in enumerate(runs["native"][0]):
    live = {w: [r[i]["downtime_live_s"] for r in rs] for w, rs in runs.items()}
    med = {w: statistics.median(xs) for w, xs in live.items()}
    out.append({"scenario": row["scenario"], "event": row["event"], "first": row["first"],
                "native_live_s": live["native"], "reference_live_s": live["reference"],
                "native_median_s": med["native"], "reference_median_s": med["reference"],
                "ratio": med["native"] / med["reference"],
                "native_prepare_s": statistics.median(r[i]["prepare_s"] for r in runs["native"])})
(here / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
