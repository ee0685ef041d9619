"""The cost model's bytes for the x8 runs' handoffs (costs.plan_work: the planner's placement, the
first N ranks surviving a scale-in; and since stop 53, the controller's choice of who leaves a
scale-in that names no node, as the runs' did: model_bytes_moved_chosen_leaving) beside the bytes each run moved and the identity placement's
(report-live.json), as JSON."""
import json
from pathlib import Path

from liver.policy import costs
from liver.policy.workload import Workload
from liver.sim.results import parallel_of
from liver.topology.presets import PRESETS

job = Workload.reference(PRESETS["tiny8"])
rows = []
for run in ("cpu-handoffs-x8", "cpu-handoffs-session2-x8"):
    for e in json.loads((Path("bench/results") / run / "report-live.json").read_text())["events"]:
        rows.append({"run": run, "event": e["event"]["kind"], "old": e["old"], "new": e["new"],
                     "run_bytes_moved": e["bytes_moved"], "run_identity_placement_bytes": e["bytes_moved_identity_placement"],
                     "leaving_chosen": e.get("leaving_chosen"),
                     "model_bytes_moved": costs.plan_work(job, parallel_of(e["old"]), parallel_of(e["new"])).moved,
                     "model_bytes_moved_chosen_leaving": costs.plan_work(job, parallel_of(e["old"]), parallel_of(e["new"]),
                                                                         chosen_leaving=True).moved})
print(json.dumps(rows, indent=1))
