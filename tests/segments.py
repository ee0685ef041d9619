"""Test helper: one rank's part of a training segment (build the World, create or load the engine,
train, digest), run on the session's worker pool (tests/conftest.py)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from liver.checkpoint import dcp as ckpt
from liver.engine.digest import gather_full_state, state_digest
from liver.engine.reference.trainer import Engine
from liver.config.fields import from_dict, with_model
from liver.topology import JobConfig, Layout, ParallelConfig, ModelConfig
from liver.world.world import World, connect_store


def run_segment(*, store_addr: str, namespace: str, rank: int, job: dict[str, Any],
                parallel: dict[str, Any], steps: int, load_from: str | None = None,
                save_to: str | None = None, digests: bool = True, gather: bool = False,
                backend: str = "gloo", generation: int = 0, log: bool = False) -> dict[str, Any]:
    """Train ``steps`` steps on this rank; returns losses, digests and phase timings."""
    timings: dict[str, float] = {}
    wall: dict[str, float] = {"start": time.time()}
    jc = with_model(from_dict(JobConfig, job, "job"), ModelConfig)
    pc = ParallelConfig.from_dict(parallel)
    layout = Layout(jc.model.num_layers, pc, jc.train)
    device = (torch.device("cuda", torch.cuda.current_device()) if backend == "nccl"
              else torch.device("cpu"))
    t0 = time.perf_counter()
    store = dist.PrefixStore(namespace + "/", connect_store(store_addr))
    world = World.build(store, generation, layout, rank, backend, device)
    world.connect()
    world.activate()
    timings["group_init_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine = Engine(jc, world, device, initialise=load_from is None)
    timings["build_s"] = time.perf_counter() - t0
    out: dict[str, Any] = {"rank": rank, "losses": [], "grad_norms": [], "step_s": []}
    if load_from is not None:
        timings["load_s"] = ckpt.load(engine, load_from)
    if digests:  # timed apart: a check, not part of a restart's cost
        t0 = time.perf_counter()
        out["digest_start"] = state_digest(engine)
        timings["digest_start_s"] = time.perf_counter() - t0
    wall["ready"] = time.time()
    for i in range(steps):
        st = engine.train_step()
        wall.setdefault("first_step_end", time.time())
        wall["last_step_end"] = time.time()
        out["losses"].append(st.loss)
        out["grad_norms"].append(st.grad_norm)
        out["step_s"].append(st.step_s)
        if log and rank == 0:
            print(f"[{pc.short()}] step: {st.step:4d}  loss: {st.loss:.4f}  grad_norm: "
                  f"{st.grad_norm:.3f}  lr: {st.lr:.2e}  tps: {st.tokens_per_s:,.0f}"
                  + (f"  mfu: {st.mfu:.1%}" if st.mfu else ""), flush=True)
    if digests:
        t0 = time.perf_counter()
        out["digest_end"] = state_digest(engine)
        timings["digest_end_s"] = time.perf_counter() - t0
    if gather:
        out["full_state"] = gather_full_state(engine)
    if save_to is not None:
        timings["save_s"] = ckpt.save(engine, save_to)
    wall["end"] = time.time()
    out["step"] = engine.step
    out["timings"] = timings
    out["wall"] = wall
    world.destroy()
    return out
