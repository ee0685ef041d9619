"""A user's own model (examples/llama.py: DTensor TP, FSDP2) reshaped live on NCCL in bfloat16
between two nodes, each in a network namespace of its own, both on the one lent GPU (issue 35's
events as far as one GPU goes: correctness, not speed; ``run.py`` says how two nodes share a GPU).
Events, each by the control endpoint once the one before is done: TP2 -> FSDP2 DP2 (reshape
1,1,2), FSDP2 DP2 -> TP2 (reshape 2,1,1), scale-in 2 -> 1 with a deadline (node1's rank goes),
node1's agent goes and a new one comes (scale-out 1 -> 2 onto a cold joiner). Digests before and
after every handoff.

    PATH=$PWD/.gpu-tools/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu-tools/lib \\
        PYTHONPATH=$PWD python bench/results/gpu-1x-netns-nccl-two-nodes/run_native.py OUT_DIR [MODEL]
    BACKEND=gloo ... OUT_DIR tiny   # a dry run on CPU
"""

import json
import os
import sys
import time
from pathlib import Path

from liver.agent.local import stop_agent
from liver.bench.nodes import LocalJob
from liver.controller.endpoint import request
from liver.engine.interface import absolute_engine_path

out = Path(sys.argv[1])
model = sys.argv[2] if len(sys.argv) > 2 else "1b"
out.mkdir(parents=True, exist_ok=True)
backend = os.environ.get("BACKEND", "nccl")
run_dir = out / f"run-native-{model}"
job = LocalJob(run_dir, ["--gpus", "2", "--parallel", "2,1,1", "--model", model, "--backend", backend,
                         "--steps", "1000000", "--end-after-events", "-1", "--digest", "switch", "--ckpt-every", "0",
                         "--set", f"engine={absolute_engine_path('examples/llama.py:RECIPE')}",
                         "--set", "job.compute_dtype=bfloat16",
                         "--set", "job.model.vocab_size=50304",  # (TP2 needs the vocabulary even)
                         # (both ranks share one GPU: a quarter of the preset's batch, so that two ranks' activations
                         # and a handoff's extra fit in one H200; at the preset's 16 x 4, 63 GB a rank at TP2)
                         "--set", "job.train.global_batch=4", "--set", "job.train.micro_batch=1"], backend=backend)


def ranks(s):
    p = s["parallel"]
    return p["tp"] * p["pp"] * p["dp"] if p else 0


def short(s):
    p = s["parallel"]
    return f"tp{p['tp']}pp{p['pp']}dp{p['dp']}" if p else None


def scale(action, cond, what):
    at = job.status()["step"]
    code, body = request(job.url, job.token, "POST", "/scale", {"action": action})
    assert code == 202, (code, body)
    s = job.wait(lambda s: s["phase"] == "stable" and cond(s) and s["step"] > at, what, 600)
    return job.wait(lambda s, at=s["step"]: s["step"] >= at + 3, f"training after {what}", 300)


t0 = time.time()
try:
    job.agent("node0", index=0)
    job.agent("node1", index=0)
    job.wait(lambda s: s["step"] >= 5 and ranks(s) == 2, "TP2 over both nodes", 600)
    scale("reshape 1,1,2", lambda s: short(s) == "tp1pp1dp2", "TP2 -> FSDP2 DP2")
    scale("reshape 2,1,1", lambda s: short(s) == "tp2pp1dp1", "FSDP2 DP2 -> TP2")
    s = scale("scale-in 1 deadline 60s", lambda s: ranks(s) == 1, "scale-in 2 -> 1 with a deadline")
    gone = next(n["node"] for n in s["nodes"] if not n["ranks"])
    stop_agent(job.agents.pop(gone), 0.0)
    job.agent(gone, index=0)  # a new agent on the node: the scale-out onto its cold joiner
    s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 2, "scale-out 1 -> 2 onto a cold joiner", 600)
    job.wait(lambda s, at=s["step"]: s["step"] >= at + 3, "training on both again", 300)
    request(job.url, job.token, "POST", "/end", {"after": 2})
    rc = job.proc.wait(300)
finally:
    job.close()
rep = json.loads((run_dir / "report.json").read_text())
result = {"backend": backend, "model": model, "engine": "examples/llama.py:RECIPE", "dtype": "bfloat16",
          "namespaces": job.net is not None, "controller_rc": rc,
          "events": [{"kind": e["event"]["kind"], "old": e.get("old"), "new": e.get("new"), "outcome": e.get("outcome"),
                      "status": e.get("status"), "downtime_s": e.get("downtime_s"), "transfer_s": e.get("transfer_s"),
                      "prepare_s": e.get("prepare_s"), "bytes_moved": e.get("bytes_moved"),
                      "digest_before": e.get("digest_before"), "digest_after": e.get("digest_after"),
                      "digest_equal": e.get("digest_equal")} for e in rep["events"]],
          "steps": rep["steps"][-1]["step"] if rep["steps"] else 0, "loss_last": rep["steps"][-1].get("loss") if rep["steps"] else None,
          "wall_s": time.time() - t0}
(out / f"netns_nccl_native_{model}.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
