"""summary.json from the interleaved runs beside it (or in the folder given): per scenario and
direction (its event, and the event back), each engine's live downtime over every event of every
run (median, and a bootstrap 95% interval of it), and the native one over the reference one."""
import json
import random
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
runs = {w: [json.loads(p.read_text()) for p in sorted(here.glob(f"bpair-{w}-*.json"))] for w in ("native", "reference")}


def ci95(xs, n=2000, rng=random.Random(0)):
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n)]]


out = []
for i, row in enumerate(runs["native"][0]):
    for way, key in (("there", "downtime_live_all_s"), ("back", "downtime_live_back_all_s")):
        xs = {w: [d for r in rs for d in r[i][key]] for w, rs in runs.items()}
        med = {w: statistics.median(v) for w, v in xs.items()}
        out.append({"scenario": row["scenario"] + ("" if way == "there" else ": the event back"), "event": row["event"] if way == "there" else f"back to {row['first']}",
                    "first": row["first"], "direction": way, "native_live_s": xs["native"],
                    "reference_live_s": xs["reference"], "native_median_s": med["native"],
                    "reference_median_s": med["reference"], "native_ci95_s": ci95(xs["native"]),
                    "reference_ci95_s": ci95(xs["reference"]), "ratio": med["native"] / med["reference"]})
(here / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
for r in out:
    print(f"{r['scenario']:<32} {r['direction']:<5} native {r['native_median_s'] * 1e3:5.1f} ms "
          f"[{r['native_ci95_s'][0] * 1e3:.1f}, {r['native_ci95_s'][1] * 1e3:.1f}]  reference "
          f"{r['reference_median_s'] * 1e3:5.1f} ms [{r['reference_ci95_s'][0] * 1e3:.1f}, "
          f"{r['reference_ci95_s'][1] * 1e3:.1f}]  {r['ratio']:.2f}x  (n={len(r['native_live_s'])}, "
          f"{len(r['reference_live_s'])})")
