"""Where a new generation's first step goes, for a user's model on CPU: rank 0 of a layout over a
fake world steps, then a second engine is entered on a new fake world of the same layout (what a
switch makes: DTensor's caches forgotten) and its first step is profiled. Prints JSON: the first
and second steps after the "switch", and the first step's seconds (under the profiler) in the
optimizer's step and in DTensor's sharding propagation (its slow path: a cache miss).

    python3 bench/probe/first_step_profile.py configs/llama-native.toml 1,1,2
"""
import cProfile
import json
import pstats
import sys
import time

import torch

from liver.config.jobfile import build, read
from liver.topology import ParallelConfig
from liver.world.fake import FakeWorld

data = read(sys.argv[1])
cfg = build({k: data[k] for k in ("engine", "preset", "job") if k in data})
ad, job = cfg.adapter, cfg.job
lay = ad.layout(job, ParallelConfig.parse(sys.argv[2]))
cpu = torch.device("cpu")
old = FakeWorld.build_fake(0, lay, 0, "gloo", cpu)
with old.registered():
    e = ad.build(job, old, cpu)
    for _ in range(3):
        e.train_step()
    state, scalars = {n: t.clone() for n, t in e.state.items()}, e.scalars()
new = FakeWorld.build_fake(1, lay, 0, "gloo", cpu)
with new.registered():
    e2 = ad.enter(job, new, cpu, lambda s: s)
    with torch.no_grad():
        for n, t in e2.state.items():
            t.copy_(state[n])
    e2.load_scalars(scalars)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    e2.train_step()
    prof.disable()
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    e2.train_step()
    second = time.perf_counter() - t1
stats = pstats.Stats(prof).stats
cum = lambda name: sum(v[3] for (f, _, fn), v in stats.items() if fn == name)  # noqa: E731
total = sum(v[2] for v in stats.values())
print(json.dumps({"config": sys.argv[1], "parallel": lay.parallel.short(), "torch": torch.__version__,
                  "first_step_profiled_s": first, "second_step_s": second, "profiled_total_s": total,
                  "in_adam_s": max(cum("_single_tensor_adam"), cum("_multi_tensor_adam"),
                                                                        cum("_fused_adam")),
                  "in_sharding_slow_path_s": cum("_propagate_op_sharding_dispatch_slow_path"),
                  "slow_path_calls": sum(v[1] for (f, _, fn), v in stats.items()
                                         if fn == "_propagate_op_sharding_dispatch_slow_path")}, indent=1))
