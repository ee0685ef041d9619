"""Megatron-Core's own checkpoint (``dist_checkpointing``) of a Megatron engine: the design's
baseline, stop-and-restart as a Megatron user does it. The model's ``sharded_state_dict``, each
parameter's two AdamW moments sharded as it is (``make_sharded_optimizer_tensor``: Megatron's
non-distributed optimizer's form, keys ``optimizer.state.exp_avg.<key>``), and the engine's
scalars as common state; saved with Megatron's default strategy (torch_dist) and loaded into any
other layout, which Megatron reshards.

Collective over torch's default group: the generation's World, which the runtime activates.
"""

from __future__ import annotations

import contextlib
import queue
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
    optimizer = {}
    for key, item in model.items():
        data = getattr(item, "data", None)
        i = _whole_parameter(data, engine.params)
        if i is None:
            continue  # (no parameter: Megatron's extra state)
        for kind, t in _optimizer_tensors(engine, i):
            optimizer[f"{kind}.{key}"] = make_sharded_optimizer_tensor(item, t, prefix=f"optimizer.state.{kind}")
    return {"model": model, "optimizer": optimizer, "scalars": engine.scalars()}


def _whole_parameter(t: Any, params: list[torch.Tensor]) -> int | None:
    """The index of the parameter ``t`` is (its elements, all of them), else None."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    return next((i for i, p in enumerate(params) if p.data_ptr() == t.data_ptr() and p.numel() == t.numel()), None)


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
    with _results_in_this_process():
        dist_checkpointing.save(sharded_state_dict(engine), str(path))
    return time.perf_counter() - t0


@contextlib.contextmanager
def _results_in_this_process():
    """Megatron's checkpoint writer hands its results over a queue kept in a module global, made at
    its first save in a process of its own (a spawned multiprocessing manager: a fresh interpreter,
    about 4.5 s on the CPU machine, paid by every restarted rank at its first save and by no
    long-running Megatron job after its first). A synchronous save, the only kind this engine makes,
    puts to that queue and reads it back in the saving process itself (its writers report over a
    queue of their own), so a queue of this process serves it: no manager is spawned, and none is
    left behind by a worker that ends by ``os._exit`` (an orphan of a few hundred MiB each)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async as writer

    kept, writer._results_queue = writer._results_queue, queue.Queue()
    try:
        yield
    finally:
        writer._results_queue = kept


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
        for name, item in wanted["optimizer"].items():
            kind, key = name.split(".", 1)
            i = _whole_parameter(wanted["model"][key].data, engine.params)
            into = dict(_optimizer_tensors(engine, i))[kind]
            got = loaded["optimizer"][name]
            if got.data_ptr() != into.data_ptr():
                into.copy_(got)
    engine.load_scalars(loaded["scalars"])
    engine.refresh()  # (the compute copies from the main weights)
    return time.perf_counter() - t0
