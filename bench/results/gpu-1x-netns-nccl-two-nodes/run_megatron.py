"""Megatron-Core reshaped live on NCCL between nodes in network namespaces of their own, all on
the one lent GPU (issue 35's third run as far as one GPU goes: correctness, not speed; ``run.py``
says how nodes share a GPU). The job file and its schedule are Megatron's GPU ones: a 1B GPT with
Megatron's DDP and distributed optimizer, bf16, from one process: scale-out 2 as TP2 onto a cold
joiner, TP2 -> two pipeline stages, back, scale-in 1 with a deadline. Digests before and after
every handoff.

    PATH=$PWD/.gpu-tools/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu-tools/lib \\
        PYTHONPATH=$PWD python bench/results/gpu-1x-netns-nccl-two-nodes/run_megatron.py OUT_DIR
    BACKEND=gloo CONFIG=configs/megatron.toml EVENTS=configs/megatron.events NODES=4 ...   # CPU dry run
"""

import json
import os
import sys
import time
from pathlib import Path

from liver.bench.nodes import LocalJob

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
backend = os.environ.get("BACKEND", "nccl")
config = os.path.abspath(os.environ.get("CONFIG", "configs/megatron-gpu-1b-distopt.toml"))
events = os.path.abspath(os.environ.get("EVENTS", "configs/megatron-gpu-x2.events"))
nodes = int(os.environ.get("NODES", "2"))
run_dir = out / "run-megatron"
extra = os.environ.get("EXTRA", "").split()  # (e.g. "--parallel 2,1,1 --gpus 2 --digest --steps 15")
job = LocalJob(run_dir, ["--config", config, "--events", events, "--backend", backend, "--steps", "1000000",
                         "--end-after-events", "4", "--ckpt-every", "0", *extra], backend=backend)
t0 = time.time()
try:
    for i in range(nodes):
        job.agent(f"node{i}", index=0)  # (every node on GPU 0)
    rc = job.proc.wait(900)  # (the job ends 4 steps after its last event)
finally:
    job.close()
if not (run_dir / "report.json").exists():
    raise SystemExit(f"the job ended without a report (controller exit {rc}):\n{job.tail()}")
rep = json.loads((run_dir / "report.json").read_text())
result = {"backend": backend, "config": os.path.relpath(config), "events_file": os.path.relpath(events),
          "namespaces": job.net is not None, "controller_rc": rc,
          "events": [{"kind": e["event"]["kind"], "old": e.get("old"), "new": e.get("new"), "outcome": e.get("outcome"),
                      "status": e.get("status"), "downtime_s": e.get("downtime_s"), "transfer_s": e.get("transfer_s"),
                      "prepare_s": e.get("prepare_s"), "bytes_moved": e.get("bytes_moved"),
                      "digest_equal": e.get("digest_equal")} for e in rep["events"]],
          "steps": rep["steps"][-1]["step"] if rep["steps"] else 0, "wall_s": time.time() - t0}
(out / "netns_nccl_megatron.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
