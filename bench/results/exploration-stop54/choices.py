"""70B on H200-class GPUs: the target choice at counts near 1,016 (target.best_up_to, as the controller and
the simulator choose) against the fastest on at most that count (target.fastest_up_to).
    PYTHONPATH=. python bench/results/exploration-stop54/choices.py > bench/results/exploration-stop54/choices.json"""
import json

from liver.engine.reference import ADAPTER
from liver.policy import target
from liver.policy.profile import load
from liver.policy.workload import Workload
from liver.sim.models import sim_model

job, hw = sim_model("70b-cluster"), target.Hardware.of(load("h200"))
work = Workload(ADAPTER, job)
rows = []
for n in (1016, 1008, 1000, 992):
    chosen, fastest = target.best_up_to(ADAPTER, job, n, hw), target.fastest_up_to(ADAPTER, job, n, hw)
    rows.append({"gpus": n, "chosen": chosen.parallel.short(), "chosen_gpus": chosen.size,
                 "chosen_step_s": target.step_time(work, chosen, hw), "fastest": fastest.parallel.short(),
                 "fastest_gpus": fastest.size, "fastest_step_s": target.step_time(work, fastest, hw)})
print(json.dumps(rows, indent=1))
