"""The figures the stop-53 note quotes for the step at the pace of the fullest pipeline stage, as JSON:
14B's 40 layers on 20 and 28 stages under the step model before (costs.py at 7bca631, from git) and now;
70B's best layout of each count a node loss from 1,024 H200-class GPUs may fall back to; the CPU fit's
error over the configurations liver bench target timed."""
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

from liver.engine.reference import ADAPTER
from liver.policy import costs, target
from liver.policy.profile import load
from liver.policy.workload import Workload
from liver.sim import results
from liver.sim.models import sim_model
from liver.topology import ParallelConfig
from liver.topology.presets import target_shape

old_src = Path("/tmp/costs_7bca631.py")
old_src.write_text(subprocess.check_output(["git", "show", "7bca631:liver/policy/costs.py"], text=True))
spec = importlib.util.spec_from_file_location("costs_7bca631", old_src)
old = importlib.util.module_from_spec(spec)
sys.modules["costs_7bca631"] = old
spec.loader.exec_module(old)

out = {"14b_40_layers_dp2": []}
w14, h200 = Workload(ADAPTER, sim_model("14b-cluster")), load("h200")
for pp in (20, 28):
    lay = ADAPTER.layout(sim_model("14b-cluster"), ParallelConfig(tp=1, pp=pp, dp=2))
    out["14b_40_layers_dp2"].append({"config": lay.parallel.short(), "gpus": lay.size,
                                     "step_s_before": old.step_time(w14, lay, h200), "step_s_now": costs.step_time(w14, lay, h200)})
hw, job70 = target.Hardware.of(h200), sim_model("70b-cluster")
w70 = Workload(ADAPTER, job70)
out["70b_best_by_count"] = []
for n in (1016, 1008, 992, 960, 896, 864):
    fit = target.fitting(ADAPTER, job70, n, hw)
    b = min(fit, key=lambda c: target.step_time(w70, c, hw)) if fit else None
    out["70b_best_by_count"].append({"gpus": n, "config": b and b.parallel.short(),
                                     "step_s": b and target.step_time(w70, b, hw)})
out["70b_on_1016_simulator_takes"] = target.best_up_to(ADAPTER, job70, 1016, hw).parallel.short()
cpu = load("cpu")
errs = [costs.step_time(Workload.reference(target_shape(sh)), lay, cpu) / t - 1
        for sh, n, lay, t in results.cpu_samples(Path("bench/results/cpu-target-choice/target.json"))]
out["cpu_fit"] = {"configurations": len(errs), "median_abs_error": statistics.median(abs(e) for e in errs),
                  "worst_abs_error": max(abs(e) for e in errs)}
print(json.dumps(out, indent=1))
