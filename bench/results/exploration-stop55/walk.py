"""How often the simulator's job changes configuration as its GPUs go down a node at a time and
back up (every count of whole nodes from 1,024 to 64 and back), each model and profile, each
choice from the configuration the job runs (``target.best_up_to``, the live move counted):
``moves`` the changes of configuration, ``returns`` the changes back to a configuration the job
left one node earlier (A -> B -> A across one node's wobble), ``slower`` the steps at a count
where the job runs a layout slower than the fastest on at most that count (samples lost to the
choice). Run from a checkout: python bench/results/exploration-stop55/walk.py > walk-<commit>.json"""

import json

from liver.engine.reference import ADAPTER
from liver.policy import target
from liver.policy.profile import load
from liver.policy.workload import Workload
from liver.sim.models import sim_model

out = []
for pname in ("h200", "a800-pcie"):
    prof = load(pname)
    hw = target.Hardware.of(prof)
    for m in ("7b-cluster", "14b-cluster", "30b-cluster", "70b-cluster", "175b-cluster"):
        job, work = sim_model(m), None
        work = Workload(ADAPTER, job)
        counts = list(range(1024, 63, -8))
        walk = counts + counts[-2::-1]
        cur = target.best_up_to(ADAPTER, job, walk[0], hw)
        seq, moves, returns, slower = [cur.parallel], 0, 0, []
        for n in walk[1:]:
            nxt = target.best_up_to(ADAPTER, job, n, hw, cur.parallel)
            if nxt is None:
                continue
            if nxt.parallel != cur.parallel:
                moves += 1
                if len(seq) >= 2 and seq[-2] == nxt.parallel:
                    returns += 1
                seq.append(nxt.parallel)
            cur = nxt
            fastest = target.fastest_up_to(ADAPTER, job, n, hw)
            slower.append(target.step_time(work, cur, hw) / target.step_time(work, fastest, hw) - 1)
        slower.sort()
        out.append({"profile": pname, "model": m, "counts": len(walk), "moves": moves, "returns": returns,
                    "step_slower_than_fastest": {"median": slower[len(slower) // 2], "p90": slower[9 * len(slower) // 10],
                                                 "max": slower[-1]}})
print(json.dumps(out, indent=1))
