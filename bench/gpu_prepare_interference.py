"""Which part of Prepare slows the running step? (issue 4, item 9: on 2 x H200 the step during
which the Shadow World's groups were warmed took +216 ms.)

WORLD processes (one per GPU) train the 1b preset at tp=WORLD in their main thread, as ranks do.
At an iteration boundary a background thread on every rank runs one part of a Preparation, as
the companion does; the steps that overlap it are compared with the two steps just before it.
Parts, interleaved over rounds (round 0, each part's first use in the process, reported apart):
- python: a pure-Python loop of 0.2 s (what holding the GIL alone costs the step),
- plan_schedule: a transfer plan of this model and the executor's schedule,
- python_fine, plan_schedule_fine: the same with Python's thread switch interval at 0.1 ms
  instead of 5 ms while they run (the training thread waits less for the GIL after each op),
- staging: the staging ring (one allocation of B through the caching allocator),
- gloo: four gloo groups of two members (WORLD=1: with a helper CPU process), built and warmed,
- nccl: a new NCCL communicator over every rank and its first collective (WORLD=1: one member),
- nccl_p2p (WORLD=2): the same, then one point-to-point message each way (connection set-up),
- preparation (WORLD=2): the runtime's whole Preparation of a reshape tp2 -> dp2 (plan, World and
  transfer group built and warmed, schedule, staging), abandoned afterwards.
PARTS=a,b,... runs only those. nccl, nccl_p2p and preparation make NCCL communicators in the
background thread, beside the training's collectives: the thing the runtime no longer does on
NCCL (it warms new groups at an iteration boundary). On 2 x H200 nccl_p2p hung (the point-to-point set-up on a new
communicator beside the training's collectives on another: bench/results/issue4-prepare-interference).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD WORLD=2 python3 bench/gpu_prepare_interference.py
    MODEL=tiny WORLD=2 python3 bench/gpu_prepare_interference.py     # CPU dry run (gloo)
Writes $OUT/prepare_interference.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import statistics
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from liver.engine.trainer import Engine, state_specs
from liver.planner import plan_transfer
from liver.runtime.companion import Preparation, layouts
from liver.runtime.mock import MockGroup
from liver.protocol.messages import GenerationSpec
from liver.protocol.store import publish_plan
from liver.topology import Layout, ParallelConfig
from liver.topology.presets import preset
from liver.transfer import StreamingExecutor
from liver.transfer.staging import StagingRing
from liver.world.group import Group
from liver.world.world import World, connect_store, make_store

OUT = Path(os.environ.get("OUT", "/tmp/out"))
MODEL = os.environ.get("MODEL", "1b")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WORLD = int(os.environ.get("WORLD", "1"))
CUDA = torch.cuda.is_available()
BACKEND = "nccl" if CUDA else "gloo"
BUDGET = 512 << 20
TIMEOUT = timedelta(seconds=120)
CPU = torch.device("cpu")


def helper(addr: str) -> None:
    """WORLD=1: the other member of the gloo groups; builds and warms each round's, until told to stop."""
    store = connect_store(addr, timeout_s=600)
    i = 0
    while store.get(f"gloo/{i}").decode() != "stop":
        for k in range(4):
            Group.create(store, f"gloo{i}/g{k}", [0, 1], 1, "gloo", CPU, TIMEOUT).warm()
        i += 1


@contextlib.contextmanager
def fine_switching(interval_s: float = 1e-4):
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class Parts:
    def __init__(self, job, rank: int, dev: torch.device, store) -> None:
        self.job, self.rank, self.dev, self.store = job, rank, dev, store
        self.count = 0  # a fresh name per use
        self.gloo_uses = 0  # WORLD=1: the helper follows these
        self.keep: list = []

    def names(self) -> list[str]:
        extra = ["nccl_p2p", "preparation"] if WORLD == 2 else []
        every = ["python", "python_fine", "plan_schedule", "plan_schedule_fine", "staging", "gloo"] + (["nccl"] if CUDA else []) + extra
        chosen = os.environ.get("PARTS")
        return [p for p in every if p in chosen.split(",")] if chosen else every

    def python(self) -> None:
        end = time.perf_counter() + 0.2
        x = 0
        while time.perf_counter() < end:
            x += 1

    def python_fine(self) -> None:
        with fine_switching():
            self.python()

    def plan_schedule_fine(self) -> None:
        with fine_switching():
            self.plan_schedule()

    def plan_schedule(self) -> None:
        m, tr = self.job.model, self.job.train
        old, new = Layout(m, ParallelConfig(tp=2), tr), Layout(m, ParallelConfig(dp=2), tr)
        specs = state_specs(self.job)
        plan = plan_transfer(old, new, specs, [0, 1], [0, 1])
        StreamingExecutor(plan, specs, self.rank % 2, MockGroup("mock", [0, 1], self.rank % 2, BACKEND, self.dev),
                          BUDGET, self.dev)

    def staging(self) -> None:
        self.keep.append(StagingRing(BUDGET, self.dev))

    def gloo(self) -> None:
        i = self.gloo_uses
        self.gloo_uses += 1
        if WORLD == 1:
            self.store.set(f"gloo/{i}", "go")
        for k in range(4):
            Group.create(self.store, f"gloo{i}/g{k}", [0, 1], self.rank, "gloo", CPU, TIMEOUT).warm()

    def nccl(self) -> None:
        if WORLD == 1:  # Group.create makes a local group of one member: a raw communicator instead
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = TIMEOUT
            pg = dist.ProcessGroupNCCL(dist.PrefixStore(f"nccl{self.count}/", self.store), 0, 1, opts)
            pg.allreduce([torch.ones(1, device=self.dev)]).wait()
            torch.cuda.current_stream(self.dev).synchronize()
            self.keep.append(pg)
            return
        g = Group.create(self.store, f"nccl{self.count}", list(range(WORLD)), self.rank, BACKEND, self.dev, TIMEOUT)
        g.warm()
        self.keep.append(g)

    def nccl_p2p(self) -> None:
        g = Group.create(self.store, f"p2p{self.count}", [0, 1], self.rank, BACKEND, self.dev, TIMEOUT)
        g.warm()
        g.warm_p2p([1 - self.rank], [1 - self.rank])
        self.keep.append(g)

    def preparation(self) -> None:
        spec = GenerationSpec(generation=100 + self.count, parallel=ParallelConfig(dp=2),
                              procs=(0, 1), old_generation=0, old_parallel=ParallelConfig(tp=2),
                              old_procs=(0, 1), kind="reshape")
        old, new = layouts(self.job, spec)  # the plan, as the controller publishes it in a run
        publish_plan(self.store, spec.generation, plan_transfer(old, new, state_specs(self.job), [0, 1], [0, 1],
                                                                placement=[0, 1]))
        prep = Preparation(job=self.job, spec=spec, proc=self.rank, store=self.store, backend=BACKEND,
                           device=self.dev, timeout_s=TIMEOUT.total_seconds(), budget_bytes=BUDGET)
        prep.run()
        if not prep.ready:
            raise RuntimeError(f"preparation failed: {prep.error!r}")
        self.keep += [prep.world, prep.transfer, prep.executor]

    def release(self) -> None:
        """Between trials, outside any measured step."""
        for x in self.keep:
            if hasattr(x, "destroy"):
                x.destroy()
            elif hasattr(x, "shutdown"):
                x.shutdown()
        self.keep.clear()
        self.count += 1
        if CUDA:
            torch.cuda.empty_cache()


def trial(engine: Engine, part, name: str, agree: Group) -> dict:
    calm = [engine.train_step().step_s for _ in range(2)]
    span: dict = {}

    def body():
        span["start"] = time.perf_counter()
        c0 = time.thread_time()
        part()
        span["cpu_s"] = time.thread_time() - c0
        span["end"] = time.perf_counter()

    th = threading.Thread(target=body)
    steps = []
    th.start()
    while True:
        t0 = time.perf_counter()
        st = engine.train_step()
        steps.append({"start": t0, "end": time.perf_counter(), "step_s": st.step_s})
        # every rank goes on until one whole step ran after the part ended on every rank
        busy = torch.tensor([0 if "end" in span and t0 > span["end"] else 1])
        agree.allreduce(busy, "max")
        if not busy.item():
            break
    th.join()
    base = statistics.median(calm)
    over = [s for s in steps if s["start"] < span["end"] and s["end"] > span["start"]]
    return {"part": name, "part_s": span["end"] - span["start"], "part_cpu_s": span["cpu_s"],
            "calm_step_s": calm, "overlapped_step_s": [s["step_s"] for s in over],
            "steps_s": [s["step_s"] for s in steps], "excess_s": sum(s["step_s"] - base for s in over)}


def rank_main(rank: int, addr: str) -> None:
    dev = torch.device("cuda", rank) if CUDA else CPU
    if CUDA:
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)
    store = connect_store(addr, timeout_s=600)
    job = preset(MODEL)
    world = World.build(store, 0, Layout(job.model, ParallelConfig(tp=WORLD), job.train), rank, BACKEND, dev,
                        cpu_groups=True)
    world.warm()
    engine = Engine(job, world, dev)
    for _ in range(3):
        engine.train_step()
    parts = Parts(job, rank, dev, store)
    trials = []
    for r in range(ROUNDS):
        for name in parts.names():
            res = trial(engine, getattr(parts, name), name, world.cpu_groups["all"])
            res["round"], res["rank"] = r, rank
            trials.append(res)
            parts.release()
            world.cpu_groups["all"].barrier()
            print(json.dumps(res), flush=True)
    if WORLD == 1:
        store.set(f"gloo/{parts.gloo_uses}", "stop")
    (OUT / f"trials-rank{rank}.json").write_text(json.dumps(trials))
    world.cpu_groups["all"].barrier()
    world.destroy()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    store, addr = make_store()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, addr)) for r in range(WORLD)]
    if WORLD == 1:
        procs.append(ctx.Process(target=helper, args=(addr,)))
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a process failed: exit codes {[p.exitcode for p in procs]}")
    trials = [t for r in range(WORLD) for t in json.loads((OUT / f"trials-rank{r}.json").read_text())]
    summary = {}
    for name in dict.fromkeys(t["part"] for t in trials):
        ts = [t for t in trials if t["part"] == name and t["round"] > 0]
        first = [t for t in trials if t["part"] == name and t["round"] == 0]
        summary[name] = {"part_s_median": statistics.median(t["part_s"] for t in ts),
                         "part_cpu_s_median": statistics.median(t["part_cpu_s"] for t in ts),
                         "excess_s_median": statistics.median(t["excess_s"] for t in ts),
                         "excess_s_first_use": [t["excess_s"] for t in first]}
    out = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())) if CUDA else None,
           "gpu": torch.cuda.get_device_name(0) if CUDA else None, "model": MODEL, "world": WORLD,
           "tp": WORLD, "rounds": ROUNDS, "summary": summary, "trials": trials}
    (OUT / "prepare_interference.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
