"""One H200, torch 2.11: is a mock World's group findable by name from another thread (autograd's device
thread runs a backward there) after the companion built on it (``registered_here``) and ``registered()``?"""
import threading

import torch
from torch.distributed import distributed_c10d as c10d

from liver.config.jobfile import build as build_config
from liver.engine.interface import load_adapter
from liver.topology import ParallelConfig
from liver.world import world as W

cfg = build_config({"preset": "tiny", "engine": "examples/llama.py:RECIPE"})
native = load_adapter(cfg.engine)
dev = torch.device("cuda", 0)
lay = native.layout(cfg.job, ParallelConfig.parse("2,1,4"))


def probe(world, what):
    names = [g.pg.group_name for g in world.every_group() if g.pg is not None]
    seen = {}

    def look(where):
        for n in names:
            try:
                c10d._resolve_process_group(n)
                seen.setdefault(where, []).append("ok")
            except Exception as e:
                seen.setdefault(where, []).append(type(e).__name__)
    look("main")
    t = threading.Thread(target=look, args=("thread",))
    t.start()
    t.join()
    print(what, names, seen, flush=True)


for companion in (False, True):
    world = native.mock_world(0, lay, 0, "nccl", dev)
    if companion:
        def prep():
            with world.registered_here():
                native.prebuild(cfg.job, world, dev, frozenset(), 1 << 40)
        t = threading.Thread(target=prep)
        t.start()
        t.join()
    with world.registered():
        probe(world, f"companion={companion}")
    W.forget_meshes()
