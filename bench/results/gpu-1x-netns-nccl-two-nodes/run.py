"""Two nodes on NCCL, each in a network namespace of its own, on the one lent GPU (issue 33 item 1).

``LocalJob`` puts the controller (and the job's store) in one namespace and each agent, with its
worker, in another, each with its own address on a bridge; each agent is started with ``--iface``
(GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for its workers) and is a host of its own to NCCL
(``NCCL_HOSTID``: the node's name), so the two ranks share the one GPU and NCCL joins them over
its socket transport, through each node's interface and the bridge. The job: both nodes train
(tp1pp1dp2), node1 gets a notice (scale-in to node0, digest checked), node1's agent goes, comes
back (scale-out onto it, digest checked), then the job ends. While both train, each worker's
environment and its namespace's TCP connections are read (its node's address to the other's),
and the workers' NCCL logs (NCCL_DEBUG=INFO) say which interface and transport NCCL took.
A correctness run: two ranks on one GPU say nothing of speed.

    PATH=$PWD/.gpu-tools/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu-tools/lib \\
        PYTHONPATH=$PWD python bench/results/gpu-1x-netns-nccl-two-nodes/run.py OUT_DIR
    BACKEND=gloo ...   # a dry run on CPU
"""

import json
import os
import re
import sys
import time
from pathlib import Path

from liver.agent.local import stop_agent
from liver.bench.nodes import LocalJob
from liver.controller.endpoint import request
from liver.host import netns

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,BOOTSTRAP,NET")
backend = os.environ.get("BACKEND", "nccl")
run_dir = out / "run"
job = LocalJob(run_dir, ["--gpus", "2", "--model", "tiny", "--backend", backend, "--steps", "1000000",
                         "--end-after-events", "-1", "--digest", "switch", "--ckpt-every", "0"], backend=backend)


def ranks(s):
    p = s["parallel"]
    return p["tp"] * p["pp"] * p["dp"] if p else 0


def holders(s):
    return {n["node"] for n in s["nodes"] if n["ranks"]}


def agent(name):
    job.agent(name, "--notice-file", str(run_dir / f"notice-{name}"), index=0)  # (both on GPU 0)


t0 = time.time()
seen = {}
try:
    agent("node0")
    agent("node1")
    s = job.wait(lambda s: s["step"] >= 10 and ranks(s) == 2, "both nodes training", 300)
    if job.net is not None:
        for name in ("node0", "node1"):
            for p in json.loads((run_dir / f"procs-{name}.json").read_text()):
                if p["alive"]:
                    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{p['pid']}/environ").read_text().split("\0")
                               if "=" in kv)
                    seen[name] = {"addr": job.node(name).addr, "pid": p["pid"],
                                  "env": {k: env.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                                                  "NCCL_HOSTID", "CUDA_VISIBLE_DEVICES")},
                                  "tcp": sorted(netns.tcp_peers(p["pid"]))}
    (run_dir / "notice-node1").write_text("30")
    s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 1 and "node1" not in holders(s),
                 "node1's rank gone after its notice", 300)
    stop_agent(job.agents.pop("node1"), 0.0)
    job.wait(lambda s, at=s["step"]: s["step"] >= at + 10, "node0 alone", 300)
    (run_dir / "notice-node1").unlink()
    agent("node1")
    s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 2 and holders(s) == {"node0", "node1"},
                 "the scale-out onto node1 again", 300)
    job.wait(lambda s, at=s["step"]: s["step"] >= at + 10, "both again", 300)
    request(job.url, job.token, "POST", "/end", {"after": 2})
    rc = job.proc.wait(300)
finally:
    job.close()
rep = json.loads((run_dir / "report.json").read_text())
logs = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("proc*.log")))
lines = sorted(set(x.split(" INFO ", 1)[1] for x in re.findall(r"NCCL INFO (?:Bootstrap|NET/Socket|Channel)[^\n]*", logs)))
result = {"backend": backend, "namespaces": job.net is not None, "loopback_why": job.loopback_why, "controller_rc": rc,
          "workers_while_both_trained": seen,
          "crossed_the_bridge": {n: any(loc == v["addr"] and rem == seen[o]["addr"] for loc, rem in v["tcp"])
                                 for n, o in (("node0", "node1"), ("node1", "node0")) if n in seen and o in seen for v in [seen[n]]},
          "events": [{"kind": e["event"]["kind"], "old": e.get("old"), "new": e.get("new"), "outcome": e.get("outcome"),
                      "downtime_s": e.get("downtime_s"), "digest_equal": e.get("digest_equal")} for e in rep["events"]],
          "steps": rep["steps"][-1]["step"] if rep["steps"] else 0,
          "nccl_lines": lines[:40], "nccl_via_net_socket": any("via NET/Socket" in x for x in lines),
          "nccl_interface_eth0": any("eth0" in x for x in lines),
          "wall_s": time.time() - t0}
(out / "netns_nccl_two_nodes.json").write_text(json.dumps(result, indent=1))
print(json.dumps({k: v for k, v in result.items() if k != "nccl_lines"}, indent=1))
