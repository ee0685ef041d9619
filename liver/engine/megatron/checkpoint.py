"""Megatron-Core's own checkpoint (``dist_checkpointing``) of a Megatron engine: the design's
baseline, stop-and-restart as a Megatron user does it. The model's ``sharded_state_dict``, each
parameter's two AdamW moments sharded as it is (``make_sharded_optimizer_tensor``: Megatron's
non-distributed optimizer's form, keys ``optimizer.state.exp_avg.<key>``), and the engine's
scalars as common state; saved with Megatron's default strategy (torch_dist) and loaded into any
other layout, which Megatron reshards.

Collective over torch's default group: the generation's World, which the runtime activates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from liver.engine.megatron.model import megatron

METADATA = "metadata.json"  # (dist_checkpointing's own, beside torch's ``.metadata``)
KINDS = ("exp_avg", "exp_avg_sq")
MAIN = "fp32_param"


def is_megatron(path: str | Path) -> bool:
    """Whether ``path`` holds a checkpoint of Megatron's ``dist_checkpointing``."""
    return (Path(path) / METADATA).exists()


def sharded_state_dict(engine: Any) -> dict[str, Any]:
    """The engine's whole state as Megatron describes it for its checkpoints."""
    from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor
    model = engine.model.sharded_state_dict(metadata={"dp_cp_group": engine.world.process_group("dp")})
    index = {p.untyped_storage().data_ptr(): i for i, p in enumerate(engine.params)}
    optimizer = {}
    for key, item in model.items():
        data = getattr(item, "data", None)
        i = index.get(data.untyped_storage().data_ptr()) if isinstance(data, torch.Tensor) else None
        if i is None or data.numel() != engine.params[i].numel():
            continue  # (no parameter: Megatron's extra state)
        for kind, t in _optimizer_tensors(engine, i):
            optimizer[f"{kind}.{key}"] = make_sharded_optimizer_tensor(item, t, prefix=f"optimizer.state.{kind}")
    return {"model": model, "optimizer": optimizer, "scalars": engine.scalars()}


def _optimizer_tensors(engine: Any, i: int) -> list[tuple[str, torch.Tensor]]:
    """Parameter ``i``'s optimizer state: its moments, and its fp32 main weight where the parameter
    is a compute copy (Megatron's mixed-precision optimizer saves it as ``fp32_param``)."""
    out = [(kind, engine.moments[kind][i]) for kind in KINDS]
    if engine.main[i].data_ptr() != engine.params[i].data_ptr():
        out.append((MAIN, engine.main[i]))
    return out


def save(engine: Any, path: str | Path) -> float:
    """Collective: the state under ``path``; seconds taken."""
    t0 = time.perf_counter()
    Path(path).mkdir(parents=True, exist_ok=True)
    megatron()  # (its import, with its warnings silenced)
    from megatron.core import dist_checkpointing
    try:
        dist_checkpointing.save(sharded_state_dict(engine), str(path))
    finally:
        _stop_writer_manager()
    return time.perf_counter() - t0


def _stop_writer_manager() -> None:
    """Megatron's checkpoint writer keeps its results queue in a process of its own (a
    multiprocessing manager, spawned at its first save and kept in a module global). A process
    that ends without running its finalizers (a worker's ``os._exit``) leaves that manager behind,
    an orphan of a few hundred MiB for every rank of every restart: it is shut down after each save
    (the next save spawns another)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async as writer

    queue, writer._results_queue = writer._results_queue, None
    manager = getattr(queue, "_manager", None)
    if manager is not None:
        manager.shutdown()


def load(engine: Any, path: str | Path) -> float:
    """Collective: the engine's state (any layout) from ``path``; seconds taken."""
    t0 = time.perf_counter()
    megatron()
    from megatron.core import dist_checkpointing
    wanted = sharded_state_dict(engine)
    loaded = dist_checkpointing.load(wanted, str(path))
    with torch.no_grad():
        missing, unexpected = engine.model.load_state_dict(loaded["model"], strict=False)
        if [k for k in missing if not k.endswith("_extra_state")] or unexpected:
            raise ValueError(f"checkpoint {path}: the model's tensors do not match it (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
        index = {p.untyped_storage().data_ptr(): i for i, p in enumerate(engine.params)}
        for name, item in wanted["optimizer"].items():
            kind, key = name.split(".", 1)
            i = index[wanted["model"][key].data.untyped_storage().data_ptr()]
            into = dict(_optimizer_tensors(engine, i))[kind]
            got = loaded["optimizer"][name]
            if got.data_ptr() != into.data_ptr():
                into.copy_(got)
    engine.load_scalars(loaded["scalars"])
    engine.refresh()  # (the compute copies from the main weights)
    return time.perf_counter() - t0
