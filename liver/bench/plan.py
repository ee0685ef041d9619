"""``liver bench plan``: planner speed and bytes on GPT-3 175B (96 layers, hidden 12288, 96 heads,
vocabulary 50257) with AdamW state, at 1,024 to 2,048 ranks."""

from __future__ import annotations

import time

from liver.engine.reference.trainer import state_specs
from liver.planner.plan import plan_transfer
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig

# SwiGLU with ffn = 8h/3 keeps the 12 h^2 per layer of GPT-3 (175B parameters).
GPT3_175B = ModelConfig(num_layers=96, hidden_size=12288, num_heads=96, ffn_size=32768,
                        vocab_size=50257, seq_len=2048, vocab_multiple=128)
TRAIN = TrainConfig(global_batch=1920, micro_batch=1)


def scenarios() -> list[tuple[str, ParallelConfig, ParallelConfig, list[int], list[int]]]:
    a_old, a_new = ParallelConfig(tp=8, pp=16, dp=8), ParallelConfig(tp=8, pp=12, dp=10)
    b_new = ParallelConfig(tp=4, pp=16, dp=16)
    c_new = ParallelConfig(tp=8, pp=16, dp=16)
    procs = list(range(1024))
    return [
        ("a: scale-in 1024 -> 960, TP8 PP16 DP8 -> TP8 PP12 DP10", a_old, a_new, procs, procs[:960]),
        ("b: in place 1024, TP8 PP16 DP8 -> TP4 PP16 DP16", a_old, b_new, procs, procs),
        ("c: scale-out 1024 -> 2048, TP8 PP16 DP8 -> TP8 PP16 DP16", a_old, c_new, procs, list(range(2048))),
    ]


def run(model: ModelConfig = GPT3_175B, repeats: int = 3) -> list[dict]:
    specs = state_specs(JobConfig(model=model, train=TRAIN))
    out = []
    for name, old_pc, new_pc, old_procs, new_procs in scenarios():
        old, new = Layout(model, old_pc, TRAIN), Layout(model, new_pc, TRAIN)
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            plan = plan_transfer(old, new, specs, old_procs, new_procs)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        s = plan.summary()
        out.append({"scenario": name, "ranks_old": old.size, "ranks_new": new.size,
                    "num_tasks": s["num_tasks"], "bytes_moved": s["bytes_moved"],
                    "bytes_moved_identity_placement": s["bytes_moved_identity_placement"],
                    "max_rank_bytes_in": s["max_rank_bytes_in"],
                    "max_rank_bytes_out": s["max_rank_bytes_out"], "plan_s": round(best, 4)})
    return out


# (preset, old, new, processes): what a worker saves by reading the controller's plan
PICKLE_CASES = [("tiny", "1,1,2", "2,1,1", 2), ("1b", "2,1,1", "1,1,2", 2), ("tiny", "2,2,2", "4,1,2", 8)]


def _least_cpu(f, n: int = 5) -> float:
    out = []
    for _ in range(n):
        t0 = time.thread_time()
        f()
        out.append(time.thread_time() - t0)
    return min(out)


def run_pickle(repeats: int = 5) -> list[dict]:
    """CPU time of planning again (placement given, as a worker would) against unpickling the
    controller's plan, rehearsed, least of ``repeats``."""
    import pickle

    from liver.topology.presets import preset

    rows = []
    for model, a, b, n in PICKLE_CASES:
        job = preset(model)
        old, new = (Layout(job.model, ParallelConfig.parse(x), job.train) for x in (a, b))
        specs, procs = state_specs(job), list(range(n))
        plan = plan_transfer(old, new, specs, procs, procs)
        blob = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        rows.append({"model": model, "old": a, "new": b, "pickle_bytes": len(blob),
                     "plan_cpu_s": _least_cpu(lambda: plan_transfer(old, new, specs, procs, procs,
                                                                    placement=plan.placement), repeats),
                     "unpickle_cpu_s": _least_cpu(lambda: pickle.loads(blob), repeats)})
    return rows
