import itertools, time
from liver.engine.reference import ADAPTER
from liver.policy import costs, target
from liver.policy.workload import Workload
from liver.policy.profile import load
from liver.sim.models import sim_model
from liver.sim.project import MODELS, every_node_count

H = 600.0
def choose_b(job, g, hw, prof, a, mode):
    if mode == "plain":
        return target.best_up_to(ADAPTER, job, g, hw)
    w = Workload(ADAPTER, job)
    for n in range(g, 0, -1):
        fit = [c for c in target.candidates(ADAPTER, job, n) if target.fits(ADAPTER, job, c, hw)]
        if fit:
            def lost(c):
                d = (costs.live(w, a.parallel, c.parallel, prof).downtime_s if mode == "live"
                     else costs.restart(w, a.parallel, c.parallel, prof).downtime_s)
                s = target.step_time(w, c, hw)
                return -((H - d) / s)
            return min(fit, key=lost)
    return None

for pname in ("h200",):
    prof = load(pname); hw = target.Hardware.of(prof)
    counts = every_node_count(prof)[::3]
    for mode in ("plain", "live", "restart"):
        t0 = time.time()
        res = {}
        for m in MODELS:
            job = sim_model(m); w = Workload(ADAPTER, job)
            for g in counts:
                a = target.best_up_to(ADAPTER, job, g, hw)
                if a is None: continue
                b = choose_b(job, g - prof.node_size, hw, prof, a, "plain" if mode == "plain" else mode)
                if b is None: continue
                res[(m, g)] = (costs.live(w, a.parallel, b.parallel, prof).downtime_s,
                               costs.restart(w, a.parallel, b.parallel, prof).downtime_s)
        bad_live = bad_rs = tot = 0
        for g in counts:
            for m1, m2 in itertools.combinations(MODELS, 2):
                if (m1, g) in res and (m2, g) in res:
                    tot += 1
                    bad_live += res[(m2, g)][0] < res[(m1, g)][0]
                    bad_rs += res[(m2, g)][1] < res[(m1, g)][1]
        print(pname, mode, "pairs", tot, "live non-monotone", bad_live, "restart non-monotone", bad_rs, f"{time.time()-t0:.0f}s")
