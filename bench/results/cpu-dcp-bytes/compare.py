"""costs.dcp_bytes summed by stage (763c259) against the per-tensor loop it replaced (e651fb3's
costs.py, read from git): the same three numbers on random configuration pairs, and the time of
every candidate of 472, 488, 504 and 1,008 GPUs read from 70B's 1,024-GPU configuration, each way (no caches)."""
import importlib.util
import json
import random
import subprocess
import sys
import time

from liver.engine.reference import ADAPTER
from liver.policy import costs, target
from liver.policy.moves import RestartMove
from liver.policy.profile import load
from liver.policy.workload import Workload
from liver.sim.models import sim_model

src = subprocess.check_output(["git", "show", "e651fb3:liver/policy/costs.py"], text=True)
spec = importlib.util.spec_from_loader("oldcosts", loader=None)
old = importlib.util.module_from_spec(spec)
sys.modules["oldcosts"] = old
exec(compile(src, "oldcosts", "exec"), old.__dict__)

random.seed(1)
pairs, worst = 0, 0.0
for m in ("7b-cluster", "70b-cluster"):
    w = Workload(ADAPTER, sim_model(m))
    for g in (64, 96, 128, 256):
        cs = target.candidates(ADAPTER, sim_model(m), g)
        for _ in range(15):
            a, b = random.choice(cs), random.choice(cs)
            x, y = old.dcp_bytes(w, a.parallel, b.parallel), costs.dcp_bytes(w, a.parallel, b.parallel)
            worst = max(worst, max(abs(p - q) / max(p, 1) for p, q in zip(x, y)))
            pairs += 1

prof, job = load("h200"), sim_model("70b-cluster")
w, hw = Workload(ADAPTER, job), target.Hardware.of(prof)
a = target.best_up_to(ADAPTER, job, 1024, hw).parallel
times = {}
cands = [c for g in (1008, 504, 488, 472) for c in target.candidates(ADAPTER, job, g)]
for name, fn in (("per_tensor", old.dcp_bytes.__wrapped__), ("by_stage", costs.dcp_bytes.__wrapped__)):
    costs._by_stage.cache_clear()  # (no cache between the two, nor from the equality check)
    t0 = time.perf_counter()
    for c in cands:
        fn(w, a, c.parallel)
    times[name] = time.perf_counter() - t0
print(json.dumps({"pairs": pairs, "timed_pairs": len(cands), "from": a.short(), "worst_relative_difference": worst, "seconds": times,
                  "speedup": times["per_tensor"] / times["by_stage"]}, indent=1))
