import itertools, time, sys
from liver.engine.reference import ADAPTER
from liver.policy import costs, target
from liver.policy.workload import Workload
from liver.policy.profile import load
from liver.sim.models import sim_model
from liver.sim.project import MODELS, every_node_count
EPS = float(sys.argv[1])
def choose_b(job, g, hw, a):
    w = Workload(ADAPTER, job)
    for n in range(g, 0, -1):
        fit = [c for c in target.candidates(ADAPTER, job, n) if target.fits(ADAPTER, job, c, hw)]
        if fit:
            best = min(target.step_time(w, c, hw) for c in fit)
            near = [c for c in fit if target.step_time(w, c, hw) <= best * (1 + EPS)]
            return min(near, key=lambda c: (sum(x != y for x, y in zip((c.tp, c.pp, c.dp), (a.tp, a.pp, a.dp))), target.step_time(w, c, hw)))
    return None
for pname in ("h200", "a800-pcie"):
    prof = load(pname); hw = target.Hardware.of(prof)
    counts = every_node_count(prof)[::2]
    t0 = time.time(); res = {}
    for m in MODELS:
        job = sim_model(m); w = Workload(ADAPTER, job)
        for g in counts:
            a = target.best_up_to(ADAPTER, job, g, hw)
            if a is None: continue
            b = choose_b(job, g - prof.node_size, hw, a) if EPS >= 0 else target.best_up_to(ADAPTER, job, g - prof.node_size, hw)
            if b is None: continue
            res[(m, g)] = (costs.live(w, a.parallel, b.parallel, prof).downtime_s, costs.restart(w, a.parallel, b.parallel, prof).downtime_s,
                           target.step_time(w, b, hw) / target.step_time(w, target.best_up_to(ADAPTER, job, g - prof.node_size, hw), hw))
    bl = br = tot = 0
    for g in counts:
        for m1, m2 in itertools.combinations(MODELS, 2):
            if (m1, g) in res and (m2, g) in res:
                tot += 1; bl += res[(m2, g)][0] < res[(m1, g)][0]; br += res[(m2, g)][1] < res[(m1, g)][1]
    worst = max(v[2] for v in res.values())
    import statistics
    print(pname, "eps", EPS, "pairs", tot, "live non-mono", bl, "restart non-mono", br, "worst step slowdown", round(worst,4),
          "median live", round(statistics.median(v[0] for v in res.values()),3), f"{time.time()-t0:.0f}s", flush=True)
