import itertools
from liver.engine.reference import ADAPTER
from liver.policy import costs, target
from liver.policy.workload import Workload
from liver.policy.profile import load
from liver.sim.models import sim_model
from liver.sim.project import MODELS
bad = tot = 0
for pname in ("h200", "a800-pcie"):
    prof = load(pname); hw = target.Hardware.of(prof)
    for g in (64, 128, 256, 512, 1024):
        # configurations valid for every model: from the biggest's candidates
        for m1, m2 in itertools.combinations(MODELS, 2):
            j1, j2 = sim_model(m1), sim_model(m2)
            c1 = {c.parallel for c in target.candidates(ADAPTER, j1, g)}
            c2 = {c.parallel for c in target.candidates(ADAPTER, j2, g)}
            d1 = {c.parallel for c in target.candidates(ADAPTER, j1, g - 8)}
            d2 = {c.parallel for c in target.candidates(ADAPTER, j2, g - 8)}
            common_a, common_b = sorted(c1 & c2, key=str)[:6], sorted(d1 & d2, key=str)[:6]
            for a in common_a:
                for b in common_b:
                    for fn in ("live", "restart"):
                        x1 = getattr(costs, fn)(Workload(ADAPTER, j1), a, b, prof).downtime_s
                        x2 = getattr(costs, fn)(Workload(ADAPTER, j2), a, b, prof).downtime_s
                        tot += 1
                        if x2 < x1 - 1e-9:
                            bad += 1
                            if bad < 8: print(pname, g, m1, m2, fn, a.short(), b.short(), x1, x2)
print("pairs", tot, "non-monotone", bad)
