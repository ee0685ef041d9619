"""Network faults between two nodes on NCCL, each node in a network namespace of its own, on the
one lent GPU (issue 33 items 1-3 on NCCL; ``run.py`` says how two nodes share it). The job starts
data-parallel over both nodes (tp1pp1dp2, so that a node's loss can be healed from the other's
replica); node1's link is cut for 1.5 s (shorter than the agent timeout of 5 s: nothing may be
lost), then cut for good: node1 is declared lost and fenced, node0's NCCL collective is aborted and
node0 heals from its own replica; the link mends, node1 registers as a new node and the job scales
out onto it; then it ends. Digests at each handoff; each event's outcome and lost steps kept.

    PATH=$PWD/.gpu-tools/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu-tools/lib \\
        PYTHONPATH=$PWD python bench/results/gpu-1x-netns-nccl-two-nodes/run_cut.py OUT_DIR
    BACKEND=gloo ...   # a dry run on CPU
"""

import json
import os
import sys
import time
from pathlib import Path

from liver.bench.nodes import LocalJob
from liver.controller.endpoint import request

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
backend = os.environ.get("BACKEND", "nccl")
run_dir = out / "run-cut"
job = LocalJob(run_dir, ["--gpus", "2", "--parallel", "1,1,2", "--model", "tiny", "--backend", backend,
                         "--steps", "1000000", "--end-after-events", "-1", "--digest", "switch", "--ckpt-every", "5",
                         "--set", "controller.agent_timeout_s=5"], backend=backend)


def ranks(s):
    p = s["parallel"]
    return p["tp"] * p["pp"] * p["dp"] if p else 0


def holders(s):
    return {n["node"] for n in s["nodes"] if n["ranks"]}


t0 = time.time()
marks = {}
try:
    if job.net is None:
        raise SystemExit(f"no network namespaces here: {job.loopback_why}")
    job.agent("node0", index=0)
    job.agent("node1", index=0)
    s = job.wait(lambda s: s["step"] >= 10 and ranks(s) == 2, "both nodes training", 300)
    link = job.node("node1")
    link.cut()
    time.sleep(1.5)
    link.mend()
    at = job.status()["step"]
    s = job.wait(lambda s: s["step"] >= at + 10, "training after the short cut", 120)
    marks["after_short_cut"] = {"ranks": ranks(s), "holders": sorted(holders(s)), "events_so_far": len(s.get("events") or [])}
    link.cut()
    t_cut = time.time()
    s = job.wait(lambda s: s["phase"] == "stable" and holders(s) == {"node0"}, "the heal on node0", 120)
    marks["cut_to_stable_on_node0_s"] = time.time() - t_cut
    link.mend()
    s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 2, "node1 back as a new node", 200)
    job.wait(lambda s, at=s["step"]: s["step"] >= at + 10, "both again", 120)
    request(job.url, job.token, "POST", "/end", {"after": 2})
    rc = job.proc.wait(300)
finally:
    job.close()
rep = json.loads((run_dir / "report.json").read_text())
logs = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("proc*.log")))
result = {"backend": backend, "controller_rc": rc, "marks": marks,
          "events": [{"kind": e["event"]["kind"], "source": e["event"].get("source"), "old": e.get("old"),
                      "new": e.get("new"), "outcome": e.get("outcome"), "lost_steps": e.get("lost_steps"),
                      "downtime_s": e.get("downtime_s"), "digest_before": e.get("digest_before"),
                      "digest_after": e.get("digest_after")} for e in rep["events"]],
          "steps": rep["steps"][-1]["step"] if rep["steps"] else 0,
          "fence_lines": sorted(set(x for x in logs.splitlines() if "fenced" in x or "declared lost" in x
                                    or "healed" in x or "parked" in x or "no answer from" in x))[:20],
          "wall_s": time.time() - t0}
(out / "netns_nccl_cut.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
