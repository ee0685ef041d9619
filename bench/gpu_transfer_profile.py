"""Where the GPU transfer's time goes (issue 3, item 6): on 2 GPUs, (1) point-to-point rate of one
message by message size, unbatched and through the executor's coalesced post; (2) one tp=1 -> tp=2
transfer of the 1.1B state into preallocated storage under torch.profiler: busy time of the NCCL
kernels and of the copy kernels on each GPU, the span from the first to the last kernel, and the
host time. Writes $OUT/profile.json and a Chrome trace per rank.
"""

import gzip
import json
import os
import shutil
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from liver.engine.trainer import state_specs
from liver.planner import plan_transfer
from liver.resource_view import view
from liver.resource_view.view import local_shape
from bench.gpu_transfer import BUDGET, MODELS, TRAIN
from liver.topology import JobConfig, Layout, ParallelConfig
from liver.transfer import StreamingExecutor
from liver.transfer.check import reference_shard
from liver.world.group import Group
from liver.world.world import connect_store, make_store

MODEL = MODELS["1.1B"]


def timed(fn, dev, group, reps=5):
    ts = []
    for _ in range(reps):
        group.barrier()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def busy(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def worker(rank, addr, out):
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    group = Group.create(connect_store(addr), "transfer", [0, 1], rank, "nccl", dev, timedelta(seconds=120))
    group.warm()
    peer, sending = 1 - rank, rank == 0
    res = {"p2p": {}}
    for mib in (1024, 512, 256, 128, 64):
        buf = torch.ones(mib << 18, device=dev)
        single = (lambda: group.send(buf, peer)) if sending else (lambda: group.recv(buf, peer))
        post = lambda: [w.wait() for w in group.post([(buf, peer)] if sending else [],
                                                     [] if sending else [(buf, peer)])]
        eight = lambda: [w.wait() for w in [x for _ in range(8) for x in group.post(
            [(buf, peer)] if sending else [], [] if sending else [(buf, peer)])]]
        for f in (single, post, eight):
            timed(f, dev, group, 2)
        res["p2p"][mib] = {"unbatched_GBps": (mib << 20) / timed(single, dev, group) / 1e9,
                           "coalesced_GBps": (mib << 20) / timed(post, dev, group) / 1e9,
                           "eight_in_a_row_GBps": 8 * (mib << 20) / timed(eight, dev, group) / 1e9}
        del buf
    job = JobConfig(model=MODEL, train=TRAIN)
    specs = state_specs(job)
    old, new = Layout(MODEL, ParallelConfig(tp=1), TRAIN), Layout(MODEL, ParallelConfig(tp=2), TRAIN)
    plan = plan_transfer(old, new, specs, [0], [0, 1])
    src = {s.name: reference_shard(s, view(s, old, 0), MODEL, dev) for s in specs} if rank == 0 else None
    into = {s.name: torch.empty(local_shape(view(s, new, rank)), device=dev) for s in specs}
    # made before, as in Prepare; its staging comes back from the allocator's cache at each run
    executor = StreamingExecutor(plan, specs, rank, group, BUDGET, dev)
    run = lambda: executor.reserve().run(src, into=into)
    res["transfer_s"] = timed(run, dev, group, 5)
    if rank == 0:  # packing the column halves of every 2-D tensor: per-slice copies against one cat
        halves = [t[:, t.shape[1] // 2:] for t in src.values() if t.dim() == 2 and t.shape[1] > 1]
        flat = torch.empty(sum(h.numel() for h in halves), device=dev)
        pieces, o = [], 0
        for h in halves:
            pieces.append(flat[o:o + h.numel()].view(h.shape))
            o += h.numel()
        host = lambda f: (lambda: (f(), torch.cuda.synchronize(dev)))
        res["pack_halves"] = {"slices": len(halves), "bytes": flat.numel() * 4}
        for label, f in (("foreach_copy", lambda: torch._foreach_copy_(pieces, halves)),
                         ("copy_each", lambda: [p.copy_(h) for p, h in zip(pieces, halves)]),
                         ("cat_flattened_out", lambda: torch.cat([h.reshape(-1) for h in halves], out=flat))):
            f(); torch.cuda.synchronize(dev)
            ts = []
            for _ in range(5):
                t0 = time.perf_counter(); f(); th = time.perf_counter() - t0
                torch.cuda.synchronize(dev); ts.append((th, time.perf_counter() - t0))
            res["pack_halves"][label] = {"host_s": statistics.median(t[0] for t in ts),
                                         "total_s": statistics.median(t[1] for t in ts)}
        del flat, pieces
    res["host_s"] = [run()[1].host_seconds for _ in range(3)]
    res["bytes_moved"] = plan.bytes_moved
    for _ in range(2):  # the first profile pays the profiler's start-up; the second is kept
        group.barrier()
        torch.cuda.synchronize(dev)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            _, st = run()
            res["profiled_run_s"] = time.perf_counter() - t0
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    iv = lambda es: [(e.time_range.start, e.time_range.end) for e in es]
    nccl = [e for e in kernels if "nccl" in e.name.lower()]
    other = [e for e in kernels if "nccl" not in e.name.lower()]
    res["profile"] = {
        "gpu_span_us": max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels),
        "nccl_busy_us": busy(iv(nccl)), "copy_busy_us": busy(iv(other)),
        "nccl_kernels": len(nccl), "other_kernels": len(other),
        "first_nccl_start_after_first_kernel_us": min(e.time_range.start for e in nccl) - min(e.time_range.start for e in kernels),
        "nccl_kernels_us": [(round(e.time_range.start), round(e.time_range.end - e.time_range.start)) for e in sorted(nccl, key=lambda e: e.time_range.start)],
        "top_kernels": [(k.key, k.count, round(k.device_time_total)) for k in sorted(prof.key_averages(), key=lambda k: -k.device_time_total)[:12]],
        "messages": st.num_chunks}
    trace = Path(out) / f"trace.rank{rank}.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    trace.unlink()
    Path(out, f"profile.rank{rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    store, addr = make_store()
    mp.start_processes(worker, args=(addr, str(out)), nprocs=2, start_method="spawn")
    ranks = [json.loads((out / f"profile.rank{r}.json").read_text()) for r in range(2)]
    (out / "profile.json").write_text(json.dumps({"budget_bytes": BUDGET, "ranks": ranks}, indent=1))
    for r, x in enumerate(ranks):
        print("rank", r, json.dumps({k: v for k, v in x.items() if k != "profile"}))
        print("rank", r, json.dumps({k: v for k, v in x["profile"].items() if k != "nccl_kernels_us"}))
