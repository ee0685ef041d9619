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
- the recipe's ``loss`` forward and backward on a batch's shape, where the model has one pipeline
  stage and no autocast would run (meta tensors are not cast: float32, or FSDP2 casting). FSDP2's
  modules would send messages in their forward (the all-gathers): for the duration, their hooks
  are taken out of this structure (the companion's own object) and each parameter they manage
  stands in as the unsharded parameter their all-gather would give (TP's DTensor on its mesh, in
  FSDP2's compute dtype), as FSDP2 itself says it (``_fsdp_stand_ins``): what then propagates is
  what the first step's forward and backward meet.

What this does not meet (a recipe's own loop doing more than ``loss``, a torch whose FSDP2 does
not say its unsharded parameters) is propagated at the first step, as before. A failure here
costs only that: it is recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from liver.engine.native.engine import fsdp, fsdp_param_groups as _param_groups
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
                try:
                    _forward(recipe, job, world, model)
                    ran.append("forward and backward")
                except Exception as e:  # (the optimizer's step is still worked out)
                    out["ahead_error"] = f"forward: {type(e).__name__}: {e}"[:300]
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
    """One stage, a DTensor in the forward (TP's: FSDP2 alone all-gathers plain tensors), and
    nothing an autocast would cast (float32, or FSDP2 casting to its compute dtype)."""
    tp = [p for p in model.parameters() if isinstance(p, DTensor) and
          (not fsdp(model) or p.device_mesh.ndim > 1)]
    return world.layout.pp == 1 and bool(tp) and (job.compute_dtype == "float32" or fsdp(model))


def _forward(recipe: Recipe, job: JobConfig, world: World, model: torch.nn.Module) -> None:
    inputs, targets = recipe.batch(job, world.coord.dp, world.layout.dp, 0)
    meta = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731
    with _unsharded(model):
        recipe.loss(model, meta(inputs), meta(targets)).backward()


@contextlib.contextmanager
def _unsharded(model: torch.nn.Module):
    """FSDP2's modules of ``model`` without their forward hooks, each parameter they manage in its
    module as its unsharded stand-in (``_fsdp_stand_ins``); all put back after. A model without
    FSDP2: as it is."""
    hooked = [m for m in model.modules() if isinstance(m, FSDPModule)]
    swaps = _fsdp_stand_ins(hooked)  # (first: raises before anything is changed)
    hooks, params = [], []  # (what was taken out, to be put back)
    try:
        for m in hooked:
            state = m._get_fsdp_state()
            ids = {h.id for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)}
            hooks.append((m, m._forward_pre_hooks, m._forward_hooks))
            m._forward_pre_hooks = OrderedDict((k, v) for k, v in m._forward_pre_hooks.items() if k not in ids)
            m._forward_hooks = OrderedDict((k, v) for k, v in m._forward_hooks.items() if k not in ids)
        for mod, name, stand_in in swaps:
            params.append((mod, name, mod._parameters[name]))
            mod._parameters[name] = stand_in
        yield
    finally:
        for mod, name, p in params:
            mod._parameters[name] = p
        for m, pre, post in hooks:
            m._forward_pre_hooks, m._forward_hooks = pre, post


def _fsdp_stand_ins(modules: list) -> list[tuple[torch.nn.Module, str, torch.nn.Parameter]]:
    """For each parameter FSDP2 manages in ``modules``: its module, its name, and the unsharded
    parameter FSDP2's all-gather would give, on the meta device: a DTensor of TP's spec where the
    parameter was one before FSDP2 (the spec as this torch's FSDP2 makes it: in its compute dtype
    where it says so), else a plain tensor; in FSDP2's compute dtype. Read from FSDP2's own
    records of its parameters (private: AttributeError where this torch keeps them otherwise)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    out = []
    for m in modules:
        for group in _param_groups(m):
            for fp in group.fsdp_params:
                info = fp._module_info
                p = info.module._parameters[info.param_name]
                dtype = group.mp_policy.param_dtype or p.dtype
                spec = getattr(fp, "_unsharded_dtensor_spec", None) or getattr(fp, "_tp_spec", None)
                if spec is None:
                    local = torch.empty(fp._orig_size, dtype=dtype, device="meta")
                else:
                    shape, _ = compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements)
                    local = torch.empty(shape, dtype=dtype, device="meta")
                    if hasattr(fp, "_get_unsharded_dtensor_spec"):  # (torch >= 2.12: the spec in its dtype)
                        spec = fp._get_unsharded_dtensor_spec(local)
                    local = DTensor(local, spec, requires_grad=False)
                out.append((info.module, info.param_name, torch.nn.Parameter(local, p.requires_grad)))
    return out


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


def fsdp_initialised(model: torch.nn.Module) -> bool:
    """FSDP2's lazy initialisation, which its first forward runs (the root's and every group's
    state: names, dtypes, streams; no message), run now on a materialised ``model`` whose root
    module is FSDP2's (else the root is whichever module runs forward first: left to it). True
    where it ran. Private to FSDP2 (``_lazy_init``): False where this torch has none."""
    if not isinstance(model, FSDPModule):
        return False
    state = model._get_fsdp_state()
    init = getattr(state, "_lazy_init", None)
    if init is None:
        return False
    init()
    return True



def fsdp_unsharded_made(model: torch.nn.Module) -> int:
    """What FSDP2's first all-gather makes once for each parameter it manages, made now on a
    materialised, initialised ``model`` (``fsdp_initialised``): the all-gather's output buffer and
    the unsharded parameter viewing it (``nn.Parameter``; TP's DTensor on its mesh), the buffer's
    storage freed at once, one parameter at a time (no memory held: the first all-gather
    allocates it again, as every later one does). No message. Parameters with FSDP2's all-gather
    extensions (their own pre/post all-gather) are left to it. Returns how many were made.
    Private to FSDP2 (``init_all_gather_outputs``, ``init_unsharded_param``)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState, free_storage

    made = 0
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        for group in _param_groups(m):
            size = group._all_gather_process_group.size() if isinstance(group.mesh_info, FSDPMeshInfo) else 1
            for fp in group.fsdp_params:
                if (hasattr(fp, "_unsharded_param") or fp.all_gather_outputs
                        or fp.sharded_state != ShardedState.SHARDED
                        or hasattr(fp._sharded_local_tensor, "fsdp_pre_all_gather")):
                    continue
                data = fp._sharded_param_data
                fp.init_all_gather_outputs([data.numel()], [fp.param_dtype or data.dtype], size, data.device)
                fp.init_unsharded_param()
                for t in fp.all_gather_outputs:
                    free_storage(t)
                made += 1
    return made
