"""``liver bench transfer`` (2 GPUs, NCCL): move a real engine state (the engine's logical tensors:
fp32 master parameters and AdamW moments) from 1 GPU to 2 (tp=1 -> tp=2) over NCCL with the
streaming executor, at two model sizes; compare achieved bandwidth with the point-to-point
bandwidth measured in the same call, and report peak extra GPU memory against B + 1 GiB.
Destination allocated during the transfer (an old rank) and beforehand (a joiner), side by side;
the first repetition pays first use (allocator, connections) and is left out.
Writes OUT/gpu_transfer.json.
"""

import json
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from liver.bench.p2p import p2p_bandwidth
from liver.engine.reference.trainer import state_specs
from liver.planner import plan_transfer
from liver.resource_view import view
from liver.resource_view.view import local_shape
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig
from liver.transfer import StreamingExecutor
from liver.transfer.check import reference_shard
from liver.world.group import Group
from liver.world.world import connect_store, make_store

TRAIN = TrainConfig(global_batch=8, micro_batch=1)
MODELS = {
    "0.6B": ModelConfig(num_layers=8, hidden_size=2048, num_heads=16, ffn_size=5632, vocab_size=50257, vocab_multiple=128),
    "1.1B": ModelConfig(num_layers=16, hidden_size=2048, num_heads=16, ffn_size=5632, vocab_size=50257, vocab_multiple=128),
}


def view_shape(spec, layout, rank):
    return local_shape(view(spec, layout, rank))


def worker(rank, addr, out_path, budget):
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    store = connect_store(addr)
    group = Group.create(store, "transfer", [0, 1], rank, "nccl", dev, timedelta(seconds=120))
    group.connect()
    result = {"p2p_GBps": p2p_bandwidth(group, 1 - rank, rank == 0, dev)}
    for label, model in MODELS.items():
        job = JobConfig(model=model, train=TRAIN)
        specs = state_specs(job)
        old, new = Layout(model, ParallelConfig(tp=1), TRAIN), Layout(model, ParallelConfig(tp=2), TRAIN)
        t0 = time.perf_counter()
        plan = plan_transfer(old, new, specs, [0], [0, 1])
        plan_s = time.perf_counter() - t0
        src = None
        if rank == 0:
            src = {s.name: reference_shard(s, view(s, old, 0), dev) for s in specs}
        state_bytes = sum(s.nbytes for s in specs)
        runs, bad = [], []
        # rep 0 pays the allocator's and NCCL's first use and is left out of the median; reps 1-3
        # allocate the destination during the transfer (an old rank's case); reps 4-6 write into
        # storage allocated beforehand (a joiner's case: its warm-up state); reps 7-9 do the same
        # with messages of up to B instead of B/2 (one message in flight: no packing overlap)
        for rep in range(10):
            preallocated = rep >= 4
            message_bytes = budget if rep >= 7 else None
            into = None
            if preallocated and rank in plan.placement:
                r = plan.placement.index(rank)
                into = {s.name: torch.empty(view_shape(s, new, r), device=dev) for s in specs}
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            # made and its staging allocated before the switch, as the runtime's Prepare does
            executor = StreamingExecutor(plan, specs, rank, group, budget, dev, message_bytes=message_bytes).reserve()
            torch.cuda.synchronize()
            group.barrier()
            torch.cuda.synchronize()  # both processes start their clocks when the barrier completed
            dst, st = executor.run(src, into=into)
            new_bytes = sum(t.numel() * t.element_size() for n, t in dst.items()
                            if (src is None or t.data_ptr() != src[n].data_ptr()) and into is None)
            peak_extra = torch.cuda.max_memory_allocated(dev) - base - new_bytes
            runs.append({"seconds": st.seconds, "preallocated": preallocated,
                         "message_bytes": message_bytes or budget // 2, "bytes_received": st.bytes_received,
                         "bytes_sent": st.bytes_sent, "bytes_local": st.bytes_local,
                         "messages": st.num_chunks, "peak_staging_bytes": st.peak_staging_bytes,
                         "peak_extra_allocated_bytes": peak_extra})
            if rep in (0, 4, 7):  # each way of running checked against the reference
                r = plan.placement.index(rank)
                bad += [s.name for s in specs if not torch.equal(dst[s.name], reference_shard(s, view(s, new, r), dev))]
            del dst, into, executor
            torch.cuda.empty_cache()
        moved = plan.bytes_moved
        med = statistics.median(r["seconds"] for r in runs[1:4])
        med_pre = statistics.median(r["seconds"] for r in runs[4:7])
        med_whole = statistics.median(r["seconds"] for r in runs[7:])
        result[label] = {"params": model.num_params(), "state_bytes": state_bytes, "bytes_moved": moved,
                         "plan_s": plan_s, "runs": runs, "median_transfer_s": med,
                         "median_transfer_preallocated_s": med_pre,
                         "median_transfer_preallocated_whole_budget_messages_s": med_whole,
                         "achieved_GBps": moved / med / 1e9, "bit_exact": not bad, "mismatched": bad[:5]}
        del src
        torch.cuda.empty_cache()
    Path(out_path + f".rank{rank}").write_text(json.dumps(result))


def run(out: str | Path, budget_mib: int = 512) -> dict:
    """Both ranks' runs and the report; needs two CUDA devices."""
    if torch.cuda.device_count() < 2:
        raise ValueError(f"liver bench transfer: needs 2 GPUs (NCCL); this machine has {torch.cuda.device_count()}")
    if budget_mib < 1:
        raise ValueError(f"--budget-mib={budget_mib}: allowed a positive size")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    budget = budget_mib << 20
    store, addr = make_store()
    mp.start_processes(worker, args=(addr, str(out / "transfer"), budget), nprocs=2, start_method="spawn")
    ranks = [json.loads((out / f"transfer.rank{r}").read_text()) for r in range(2)]
    report = {"budget_bytes": budget, "torch": torch.__version__, "p2p_GBps": ranks[0]["p2p_GBps"], "models": {}}
    for label in MODELS:
        r0, r1 = ranks[0][label], ranks[1][label]
        t_pre = max(r0["median_transfer_preallocated_s"], r1["median_transfer_preallocated_s"])
        t_whole = max(r0["median_transfer_preallocated_whole_budget_messages_s"],
                      r1["median_transfer_preallocated_whole_budget_messages_s"])
        report["models"][label] = {
            "median_transfer_preallocated_s": t_pre,
            "achieved_preallocated_GBps": r0["bytes_moved"] / t_pre / 1e9,
            "fraction_of_p2p_preallocated": r0["bytes_moved"] / t_pre / 1e9 / ranks[0]["p2p_GBps"],
            "fraction_of_p2p_preallocated_messages_of_B": r0["bytes_moved"] / t_whole / 1e9 / ranks[0]["p2p_GBps"],
            "params": r0["params"], "state_GiB": r0["state_bytes"] / 2**30, "moved_GiB": r0["bytes_moved"] / 2**30,
            "median_transfer_s": max(r0["median_transfer_s"], r1["median_transfer_s"]),
            "achieved_GBps": r0["bytes_moved"] / max(r0["median_transfer_s"], r1["median_transfer_s"]) / 1e9,
            "fraction_of_p2p": r0["bytes_moved"] / max(r0["median_transfer_s"], r1["median_transfer_s"]) / 1e9 / ranks[0]["p2p_GBps"],
            "peak_extra_allocated_GiB": max(x["peak_extra_allocated_bytes"] for r in (r0, r1) for x in r["runs"]) / 2**30,
            "limit_GiB(B+1GiB)": budget / 2**30 + 1,
            "bit_exact": r0["bit_exact"] and r1["bit_exact"], "plan_s": r0["plan_s"], "per_rank": [r0, r1]}
    (out / "gpu_transfer.json").write_text(json.dumps(report, indent=1))
    for k, v in report["models"].items():
        print(k, {kk: vv for kk, vv in v.items() if kk != "per_rank"})
    print("p2p GB/s", report["p2p_GBps"])
    return report
