"""Probe (issue 29, the GPU image's CPU path): the engine built on Prepare's storage and the one
built at the switch, after one step on a fake world: which tensors differ, by how much, and the
64-byte alignment of their storage. Prints JSON lines."""
import json
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from test_native import EXAMPLE, job_of  # noqa: E402

from liver.engine.interface import load_adapter  # noqa: E402
from liver.engine.native.engine import NativeEngine  # noqa: E402
from liver.topology import ParallelConfig  # noqa: E402
from liver.world.fake import FakeWorld  # noqa: E402
from liver.world.world import forget_meshes  # noqa: E402

print(json.dumps({"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}))
adapter = load_adapter(EXAMPLE)
job = job_of(hidden=8, heads=4, ffn=8, vocab=8)
for parallel in (ParallelConfig(tp=2, dp=2), ParallelConfig(dp=2)):
    layout = adapter.layout(job, parallel)
    active = FakeWorld.build_fake(0, adapter.layout(job, ParallelConfig(tp=4)), 3, "gloo", torch.device("cpu"))
    shadow = FakeWorld.build_fake(1, layout, 1, "gloo", torch.device("cpu"))
    seen = {}
    with active.registered():
        def companion():
            with shadow.registered_here():
                seen["pre"] = adapter.prebuild(job, shadow, torch.device("cpu"), frozenset({"norm.weight"}), 1 << 30)
        t = threading.Thread(target=companion)
        t.start()
        t.join()
    pre = seen["pre"]

    def fill(state):
        with torch.no_grad():
            for i, (name, t) in enumerate(sorted(state.items())):
                t.copy_(torch.arange(t.numel(), dtype=torch.float64).reshape(t.shape).to(t.dtype) / (i + 7))
        return state

    with shadow.registered():
        built = [adapter.enter(job, shadow, torch.device("cpu"), fill, prebuilt=p) for p in (pre, None)]
        before = {n: (built[0].state[n].data_ptr() % 64, built[1].state[n].data_ptr() % 64) for n in built[0].state}
        scalars = {"step": 4, "consumed_samples": 4 * job.train.global_batch, "seed": job.train.seed,
                   "optimizer": {"step": 4.0}, "lr": [1e-3]}
        for e in built:
            e.load_scalars(scalars)
        steps = [e.train_step() for e in built]
        diff = {n: float((built[0].state[n].double() - built[1].state[n].double()).abs().max())
                for n in built[0].state if not torch.equal(built[0].state[n], built[1].state[n])}
        opt = built[0].optimizer
        print(json.dumps({"parallel": parallel.short(), "loss": [s.loss for s in steps],
                          "differ": {n: [d, before[n]] for n, d in diff.items()},
                          "same": len(built[0].state) - len(diff),
                          "optimizer": type(opt).__name__, "foreach": opt.defaults.get("foreach"),
                          "fused": opt.defaults.get("fused")}))
        forget_meshes()
