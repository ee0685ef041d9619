"""A new generation's first step, its DTensor work done ahead: in the companion, before the pause.

The first step on a new mesh pays DTensor's sharding propagation for every operator it meets
(``liver/world/sharding.py``): on CPU a first step of the example's small model took 0.11-0.40 s
against 0.03-0.07 s for the next, most of it in the optimizer's step over DTensor parameters.
Here the companion runs, on the new model's structure (laid out on the new mesh, its tensors on
the meta device: no storage, no arithmetic, no message), what the first step will run through
DTensor, so that its thread's table holds each propagation; the training thread takes that table
at the switch (``forget_meshes(keep=...)``):

- the optimizer's step over every parameter, its state made as a switch makes it, with the
  implementation (fused, foreach) the recipe picks for parameters on the job's device (asked over
  stand-ins there: the meta device would get another);
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

from liver.engine.native.engine import fsdp
from liver.engine.native.recipe import Recipe
from liver.topology import JobConfig
from liver.world import sharding
from liver.world.world import World

IMPLEMENTATION = ("fused", "foreach", "capturable")
"""The optimizer's flags that choose which kernels its step runs."""


def first_step_ahead(recipe: Recipe, job: JobConfig, world: World, model: torch.nn.Module, kinds,
                     device: torch.device) -> tuple[dict, dict[str, Any]]:
    """Runs the first step's DTensor operators on ``model`` (meta tensors, on ``world``'s mesh)
    in the calling thread; ``kinds``: the optimizer's state (``optim.OptimizerState``);
    ``device``: where the engine trains (the optimizer's implementation is the one it gets there);
    the forward and backward too, where the model allows. Returns the table of
    propagations (``sharding.filling``) and the record's ``ahead`` (what ran), ``ahead_s`` and,
    if something failed, ``ahead_error``. ``model`` is left as it was (no gradient kept)."""
    t0, ran, out = time.perf_counter(), [], {}
    params = list(model.parameters())
    with sharding.filling() as table:
        try:
            if _forward_ahead(job, world, model):
                _forward(recipe, job, world, model)
                ran.append("forward and backward")
            for p in params:  # (the forward's gradients where it ran, else stand-ins of their layout)
                if p.requires_grad and p.grad is None:
                    p.grad = torch.empty_like(p)
            _optimizer_step(recipe, job, model, kinds, device)
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
    return world.layout.pp == 1 and not fsdp(model) and job.compute_dtype == "float32" \
        and any(isinstance(p, DTensor) for p in model.parameters())


def _forward(recipe: Recipe, job: JobConfig, world: World, model: torch.nn.Module) -> None:
    inputs, targets = recipe.batch(job, world.coord.dp, world.layout.dp, 0)
    meta = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731
    recipe.loss(model, meta(inputs), meta(targets)).backward()


def _optimizer_step(recipe: Recipe, job: JobConfig, model: torch.nn.Module, kinds, device: torch.device) -> None:
    groups = implementation(recipe, job, model, device)  # (first: it borrows the model's parameters)
    opt = recipe.optimizer(model, job)
    for mine, flags in zip(opt.param_groups, groups):
        mine.update(flags)
    for group in opt.param_groups:
        for p in group["params"]:
            kinds.make(opt, group, p, {})
    with torch.no_grad():
        opt.step()


def implementation(recipe: Recipe, job: JobConfig, model: torch.nn.Module, device: torch.device) -> list[dict]:
    """Per parameter group, the flags (``IMPLEMENTATION``) the recipe's optimizer takes for
    ``model`` were its parameters on ``device``: asked over one-element stand-ins there (DTensors
    where the parameter is one, on its mesh and placements), put in the parameters' places for the
    duration."""
    held = []
    try:
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    held.append((mod, name, p))
                    mod._parameters[name] = torch.nn.Parameter(_stand_in(p, device), p.requires_grad)
        try:
            groups = recipe.optimizer(model, job).param_groups
        except Exception:  # (a recipe whose optimizer wants more than stand-ins: as on the meta device)
            groups = []
    finally:
        for mod, name, p in held:
            mod._parameters[name] = p
    return [{k: g[k] for k in IMPLEMENTATION if k in g} for g in groups]


def _stand_in(p: torch.Tensor, device: torch.device) -> torch.Tensor:
    local = torch.zeros((1,) * p.dim(), dtype=p.dtype, device=device)
    if isinstance(p, DTensor):
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False)
    return local
