"""One H200: where a new engine's first step beyond its second goes, for the example at a preset
(argv[1]) on rank 0 of a layout (argv[2]: TP,PP,DP; argv[3:]: job fields) over a mock world, with the switch's prebuild (the first step's DTensor work done ahead): the
first and third steps under cProfile, the functions whose cumulative time differs most."""
import cProfile
import pstats
import sys
import threading
import time

import torch

from liver.bench import build
from liver.config.jobfile import build as build_config, override
from liver.engine.interface import load_adapter
from liver.topology import ParallelConfig
from liver.world import sharding

cfg = build_config({"preset": sys.argv[1], "engine": "examples/llama.py:RECIPE"}, override("job.train.micro_batch=1"),
                   *[override(x) for x in sys.argv[3:]])
ad = load_adapter(cfg.engine)
dev = torch.device("cuda", 0)
lay = ad.layout(cfg.job, ParallelConfig.parse(sys.argv[2]))
build._enter_s(ad, cfg.job, lay, dev, build.ALL)  # (warm: kernels, cuBLAS)
world = ad.mock_world(0, lay, 0, "nccl", dev)
made = []


def prepare():
    with world.registered_here():
        made.append(ad.prebuild(cfg.job, world, dev, {}, build.ALL))


t = threading.Thread(target=prepare)
t.start()
t.join()
print("ahead:", made[0].ahead, "table:", len(made[0].sharding or {}))
stats = []
with world.registered():
    e = ad.enter(cfg.job, world, dev, lambda s: s, prebuilt=made[0])
    for i in range(3):
        p = cProfile.Profile()
        t0 = time.perf_counter()
        p.enable()
        e.train_step()
        torch.cuda.synchronize()
        p.disable()
        print("step", i, round(time.perf_counter() - t0, 4), "propagations computed so far", sharding.computed())
        stats.append({(f, l, fn): v[3] for (f, l, fn), v in pstats.Stats(p).stats.items()})
diff = sorted(((stats[0].get(k, 0) - stats[2].get(k, 0), k) for k in stats[0]), reverse=True)[:30]
for d, (f, l, fn) in diff:
    print(f"{d:8.4f}  {fn}  {f.split('site-packages/')[-1]}:{l}")
