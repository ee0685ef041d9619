"""One node on NCCL in a network namespace of its own (issue 33 item 1, as far as one GPU goes):
``LocalJob`` puts the controller (and the job's store) in one namespace and the agent, with its
worker, in another, each with its own address on a bridge; the agent is started with ``--iface``,
so its worker's gloo and NCCL connections use that interface. The worker trains on NCCL, and its
NCCL log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,NET) says which interface its
bootstrap took. Two nodes need two GPUs (NCCL refuses two ranks of a communicator on one GPU).

    PYTHONPATH=$PWD python bench/results/gpu-1x-netns-nccl/run.py OUT_DIR
    BACKEND=gloo ...   # a dry run on CPU
"""

import json
import os
import re
import sys
import time
from pathlib import Path

from liver.bench.nodes import LocalJob

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,BOOTSTRAP,NET")
backend = os.environ.get("BACKEND", "nccl")  # (gloo: a dry run on CPU)
job = LocalJob(out / "run", ["--gpus", "1", "--model", "tiny", "--backend", backend, "--steps", "100000",
                             "--ckpt-every", "0"], backend=backend)
t0 = time.time()
try:
    job.agent("node0", index=0)
    s = job.wait(lambda s: s["step"] >= 20, "20 steps on NCCL", 300)
finally:
    job.close()
logs = "\n".join(p.read_text(errors="replace") for p in sorted((out / "run" / "logs").glob("proc*.log")))
net = re.findall(r"NCCL INFO (?:Bootstrap|NET/Socket)[^\n]*", logs)
result = {"backend": backend, "namespaces": job.net is not None, "loopback_why": job.loopback_why, "steps": s["step"],
          "nodes": s["nodes"], "nccl_interface_lines": sorted(set(x.split(" INFO ", 1)[1] for x in net))[:10],
          "used_eth0": any("eth0" in x for x in net), "used_lo": any(re.search(r"\blo\b", x) for x in net),
          "wall_s": time.time() - t0}
(out / "netns_nccl.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
