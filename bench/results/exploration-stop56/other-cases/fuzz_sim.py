import random, sys, traceback
from liver.sim import engine, sources, losses
from liver.sim.models import sim_model
from liver.policy.profile import load, PROFILES
rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
bad = runs = 0
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 200):
    model = rng.choice(["1b-cluster", "7b-cluster", "14b-cluster", "30b-cluster"])
    gpus = rng.choice([8, 16, 24, 32, 40, 48, 56, 64, 72, 96, 120, 128])
    interval = rng.choice([2.0, 5.0, 20.0, 60.0]); notice = rng.choice([0.0, 5.0, 30.0, 120.0])
    seed = rng.randint(0, 10**6); profile = rng.choice(PROFILES)
    takes = rng.choice([losses.RandomNodes(rng.randint(0, 99)), losses.IdleFirst(), losses.JobFirst()])
    job, prof = sim_model(model), load(profile)
    try:
        changes = sources.synthetic(gpus, prof.node_size, interval * 60, notice, 2.0, seed=seed)
    except Exception as e:
        continue
    for policy in engine.POLICIES:
        runs += 1
        try:
            a = engine.simulate(job, prof, policy, gpus, changes, 2.0, takes=takes)
            assert 0.0 <= a.goodput <= 1.0 and 0.0 <= a.efficiency <= 1.0 + 1e-9, (a.goodput, a.efficiency)
            for v in (a.useful_s, a.downtime_s, a.lost_s, a.slow_s, a.idle_s):
                assert v >= 0
            assert a.useful_s + a.downtime_s + a.slow_s + a.idle_s <= a.wall_s + a.lost_s + 1e-6
        except Exception as e:
            bad += 1
            print("FAIL", model, gpus, interval, notice, seed, profile, type(takes).__name__, policy, repr(e)[:200]); sys.stdout.flush()
print("runs", runs, "bad", bad)
