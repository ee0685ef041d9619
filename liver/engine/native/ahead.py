"""A new generation's first step, its DTensor work done ahead: in the companion, before the pause.

The first step on a new mesh pays DTensor's sharding propagation for every operator it meets
(``liver/world/sharding.py``): on CPU a first step of the example's small model took 0.11-0.40 s
against 0.03-0.07 s for the next, most of it in the optimizer's step over DTensor parameters.
Here the companion runs, on the new model's structure (laid out on the new mesh, its tensors on
the meta device: no storage, no arithmetic, no message), what the first step will run through
DTensor, so that its thread's table holds each propagation; the training thread takes that table
at the switch (``forget_meshes(keep=...)``):

- the optimizer's step over every parameter, its state made as a switch makes it, with the
  implementation (fused, foreach) the running optimizer uses (the recipe picks it from its
  parameters' device, which here is the meta device);
- where the model's forward sends no message of its own (no FSDP2 module, one pipeline stage,
  no autocast: meta tensors are not cast), the recipe's ``loss`` forward and backward on a batch's
  shape.

What this does not meet (a recipe's own loop doing more than ``loss``, FSDP2's forward) is
propagated at the first step, as before. A failure here costs only that: it is recorded.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from liver.engine.native.recipe import Recipe
from liver.topology import JobConfig
from liver.world import sharding
from liver.world.world import World

IMPLEMENTATION = ("fused", "foreach", "capturable")
"""The optimizer's flags that choose which kernels its step runs."""


def first_step_ahead(recipe: Recipe, job: JobConfig, world: World, model: torch.nn.Module, kinds,
                     like: torch.optim.Optimizer | None = None,
                     with_forward: bool = True) -> tuple[dict, dict[str, Any]]:
    """Runs the first step's DTensor operators on ``model`` (meta tensors, on ``world``'s mesh)
    in the calling thread; ``kinds``: the optimizer's state (``optim.OptimizerState``); ``like``:
    the optimizer this process runs now (its implementation copied), None for a joiner;
    ``with_forward``: the forward and backward too, where the model allows. Returns the table of
    propagations (``sharding.filling``) and the record's ``ahead`` (what ran), ``ahead_s`` and,
    if something failed, ``ahead_error``. ``model`` is left as it was (no gradient kept)."""
    t0, ran, out = time.perf_counter(), [], {}
    params = list(model.parameters())
    with sharding.filling() as table:
        try:
            if with_forward and _forward_ahead(job, world, model):
                _forward(recipe, job, world, model)
                ran.append("forward and backward")
            for p in params:  # (the forward's gradients where it ran, else stand-ins of their layout)
                if p.requires_grad and p.grad is None:
                    p.grad = torch.empty_like(p)
            _optimizer_step(recipe, job, model, kinds, like)
            ran.append("optimizer step")
        except Exception as e:  # (what ran so far is kept; the rest is propagated at the first step)
            out["ahead_error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            for p in params:
                p.grad = None
    out["ahead"] = " and ".join(ran) if ran else "nothing"
    out["ahead_s"] = time.perf_counter() - t0
    return table, out


def _forward_ahead(job: JobConfig, world: World, model: torch.nn.Module) -> bool:
    from liver.engine.native.engine import fsdp
    return world.layout.pp == 1 and not fsdp(model) and job.compute_dtype == "float32" \
        and any(isinstance(p, DTensor) for p in model.parameters())


def _forward(recipe: Recipe, job: JobConfig, world: World, model: torch.nn.Module) -> None:
    inputs, targets = recipe.batch(job, world.coord.dp, world.layout.dp, 0)
    meta = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731
    recipe.loss(model, meta(inputs), meta(targets)).backward()


def _optimizer_step(recipe: Recipe, job: JobConfig, model: torch.nn.Module, kinds,
                    like: torch.optim.Optimizer | None) -> None:
    opt = recipe.optimizer(model, job)
    if like is not None:  # the running optimizer's kernels (same recipe, same device: the same choice)
        for mine, theirs in zip(opt.param_groups, like.param_groups):
            mine.update({k: theirs[k] for k in IMPLEMENTATION if k in theirs})
    for group in opt.param_groups:
        for p in group["params"]:
            kinds.make(opt, group, p, {})
    with torch.no_grad():
        opt.step()
