"""One rank of a user's PyTorch-native job (a ``Recipe``) as the runtime's ``TrainingEngine``.

Built once per generation on that generation's World: the model on the meta device, cut to this
rank's pipeline stage (the recipe's ``stage``, where pp > 1), the user's ``parallelize`` over the
World's own mesh (``World.mesh``: its axes are this generation's
groups), then storage for this rank's shards only (``to_empty``) and the optimizer's state made
at once (zeros, as Adam would make it at its first step). The storage is then filled: from the
seed (each parameter's whole initial value cut to this rank's box), from a DCP checkpoint, or by
the live transfer (the executor writes straight into it). ``state`` maps each logical tensor's
name to this rank's local tensor: the DTensor's own storage, no copy. With pipeline stages,
``torch.distributed.pipelining`` runs the step (GPipe over the layout's micro-batches, the
recipe's ``criterion`` on the last stage), over the mesh's "pp" group.
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from liver.engine.flops import mfu as model_flops_utilisation, peak_flops
from liver.engine.interface import StepStats, Update
from liver.host import faults
from liver.engine.native.init import initial_values
from liver.engine.native.optim import OptimizerState, describe
from liver.engine.native.recipe import Recipe, clip_grad_norm
from liver.engine.native.resource import blocks, local_box, persistent_buffers, placed_state
from liver.resource_view.view import Box
from liver.topology import JobConfig, ModelFacts
from liver.world.fake import FakeWorld
from liver.world.world import World, forget_meshes


def structure(recipe: Recipe, job: JobConfig, world: World) -> torch.nn.Module:
    """The model of ``world``'s rank on the meta device: built, cut to its pipeline stage (the
    recipe's ``stage``) and parallelised on the World's mesh (the recipe's ``parallelize``). No
    storage, no collective: the companion makes it before the pause (``prebuild``)."""
    forget_meshes()  # (this thread's caches: a joiner prepares where it warmed up on a fake mesh)
    mesh = world.mesh()
    with torch.device("meta"):
        model = recipe.model(job)
    lay, c = world.layout, world.coord
    if lay.pp > 1:
        lo, hi = lay.stage_bounds[c.pp]
        model = recipe.stage(model, range(lo, hi), c.pp == 0, c.pp == lay.pp - 1) or model
    return recipe.parallelize(model, mesh, job) or model


def fsdp(model: torch.nn.Module) -> bool:
    """FSDP2 keeps a rank's parameter shards as views into its own padded buffer: never adopted."""
    return any(isinstance(m, FSDPModule) for m in model.modules())


def fsdp_param_groups(module: FSDPModule) -> list:
    """FSDP2's parameter groups of ``module`` (private: as this torch keeps them)."""
    state = module._get_fsdp_state()
    groups = state.__dict__.get("_fsdp_param_groups")
    if groups is None:  # (torch < 2.12: one group)
        groups = [g] if (g := getattr(state, "_fsdp_param_group")) is not None else []
    return groups


def fsdp_compute_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype FSDP2 computes ``model``'s parameters in (its mixed precision's ``param_dtype``),
    where it manages every parameter and every group of it names the same one; else None (no
    FSDP2, or the parameters' own dtypes)."""
    managed, dtypes = set(), set()
    for m in model.modules():
        if isinstance(m, FSDPModule):
            for group in fsdp_param_groups(m):
                dtypes.add(group.mp_policy.param_dtype)
                managed |= {id(fp._module_info.module._parameters[fp._module_info.param_name]) for fp in group.fsdp_params}
    every = all(id(p) in managed for p in model.parameters())
    return dtypes.pop() if every and len(dtypes) == 1 and None not in dtypes else None


def build_model(recipe: Recipe, job: JobConfig, world: World, device: torch.device,
                adopt: dict[str, torch.Tensor] | None = None, make_state: bool = True,
                model: torch.nn.Module | None = None, sharding: dict | None = None, here: bool = True):
    """The model and optimizer of ``world``'s rank, on ``device`` (``torch.device("meta")`` for
    metadata only); and their tensors as ``Placed``. The World must be registered
    (``World.activate``): DeviceMesh asks the default group for the rank. ``make_state``: the
    optimizer's state made now, to be written (a switch, a checkpoint's load); else the optimizer
    makes it at its first step, with its own initial values. ``adopt``: local tensors (by state
    name) to use as storage instead of new memory (``adopted``). ``model``: its ``structure``,
    made before (on this World, in the companion); ``sharding``: DTensor's propagation on this
    World's meshes, worked out there (``ahead.py``): this thread's from now. ``here``: built in
    the thread that trains it (its DTensor caches forgotten first); else in the companion, whose
    caches are its own (``structure``): the training thread forgets its own at the switch
    (``NativeAdapter.enter``)."""
    if here:
        forget_meshes(keep=sharding, device=device)  # (meshes of other worlds compare equal to this one: world.py)
    if model is None:
        model = structure(recipe, job, world)
    adopt = adopt if device.type != "meta" and adopt else {}
    if device.type != "meta":
        own = {} if fsdp(model) else adopt
        names = {id(p): n for n, p in [*model.named_parameters(), *persistent_buffers(model)]}
        model._apply(lambda t: adopted(own.get(names.get(id(t), "")), t, device))  # (to_empty, adopting)
        _nan_buffers(model)
        recipe.init_buffers(model, job)
        _check_buffers(model)
    optimizer = recipe.optimizer(model, job)
    kinds = optimizer_state(recipe, job)
    if make_state:
        names = {id(p): n for n, p in model.named_parameters()}  # (again: _apply may have made new Parameters)
        for group in optimizer.param_groups:
            for p in group["params"]:
                n = names.get(id(p))
                like = {k: adopted(adopt[f"{n}.{k}"], p, device) for k, dtype in kinds.tensors
                        if dtype is None and f"{n}.{k}" in adopt}
                kinds.make(optimizer, group, p, like)
    return model, optimizer, placed_state(model, optimizer, kinds)


_described: dict[int, tuple[Recipe, dict[JobConfig, OptimizerState]]] = {}
"""By the recipe's id, the recipe held beside its descriptions (its id is not reused meanwhile; a
recipe need not be hashable)."""


def optimizer_state(recipe: Recipe, job: JobConfig) -> OptimizerState:
    """What the recipe's optimizer keeps per parameter (``optim.describe``), once per recipe and job."""
    known = _described.setdefault(id(recipe), (recipe, {}))[1]
    if job not in known:
        with torch.device("meta"):
            whole = recipe.model(job)
        known[job] = describe(lambda m: recipe.optimizer(m, job), whole, recipe.name)
    return known[job]


def _non_persistent(model: torch.nn.Module):
    """Each floating non-persistent buffer by qualified name, with its local tensor."""
    for prefix, mod in model.named_modules():
        for n in mod._non_persistent_buffers_set:
            b = mod._buffers.get(n)
            if b is not None and b.is_floating_point():
                yield (f"{prefix}.{n}" if prefix else n), _local(b)


def _nan_buffers(model: torch.nn.Module) -> None:
    """Non-persistent buffers' new storage shows as NaN until the recipe's ``init_buffers`` sets it."""
    with torch.no_grad():
        for _, b in _non_persistent(model):
            b.fill_(float("nan"))


def _check_buffers(model: torch.nn.Module) -> None:
    for name, b in _non_persistent(model):
        if torch.isnan(b).any():
            raise ValueError(f"non-persistent buffer {name!r} is not set after the recipe's init_buffers: a buffer "
                             f"made in __init__ is not reproduced on the meta device; compute it in the recipe's "
                             f"init_buffers(model, job)")


def adopted(old: torch.Tensor | None, like: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor like ``like`` (a DTensor or a plain one) on ``device``: with ``old`` as its local
    storage where it fits (DTensor.from_local: no copy), else uninitialised."""
    local = like._local_tensor if isinstance(like, DTensor) else like
    if old is None or tuple(old.shape) != tuple(local.shape) or old.dtype != local.dtype or old.device != device \
            or not old.is_contiguous():
        return torch.empty_like(like, device=device)
    old = old.detach()
    if isinstance(like, DTensor):
        try:  # ``like``'s own spec (mesh, placements, global shape): DTensor.from_local's result, made directly
            return DTensor(old, like._spec, requires_grad=False)
        except TypeError:  # pragma: no cover (another torch's constructor)
            return DTensor.from_local(old, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                                      stride=like.stride())
    return old


def stage_activations(recipe: Recipe, job: JobConfig, layout, stage: int, micro_inputs: torch.Tensor,
                      compute_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and output of pipeline stage ``stage`` for one micro-batch, as meta tensors: the
    whole model's stages before it and it, cut by the recipe and not parallelised, run on the meta
    device (the activations between stages are whole tensors, as TP's replicated outputs are).
    ``compute_dtype``: FSDP2's mixed precision (``fsdp_compute_dtype``), run as FSDP2 runs it:
    the parameters in it (not the buffers), a stage's floating input cast to it. The activations
    come out in the dtype the stages make and send (bfloat16 there: half the bytes of float32)."""
    x = torch.empty_like(micro_inputs, device="meta")
    for s in range(stage + 1):
        with torch.device("meta"):
            whole = recipe.model(job)
        lo, hi = layout.stage_bounds[s]
        part = recipe.stage(whole, range(lo, hi), s == 0, s == layout.pp - 1) or whole
        x_in = x
        if compute_dtype is not None:
            for m in part.modules():
                for name, p in m._parameters.items():
                    if p is not None and p.is_floating_point():
                        m._parameters[name] = torch.nn.Parameter(p.to(compute_dtype), p.requires_grad)
            x = x.to(compute_dtype) if x.is_floating_point() else x
        with torch.no_grad():
            x = part(x)
    return x_in, x


def _as_sent(dtype: torch.dtype):
    """A stage's forward hook: its floating outputs in ``dtype``, the activations' dtype the next
    stage's receive buffers have (``stage_activations``: the model's own, worked out on the meta
    device, in FSDP2's compute dtype where FSDP2 computes the stage). The loop's precision can
    make them another: an autocast's outputs bfloat16 where the meta device works out float32; sent
    as they are into float32 buffers they would arrive as garbage (torch 2.13 no longer checks what
    a stage sends). Widening is exact, and autograd narrows the gradient coming back the same way."""
    def hook(module, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.dtype != dtype:
            return out.to(dtype)
        return out
    return hook


@functools.cache
def _stage_class() -> type:
    """torch's ``PipelineStage`` whose last stage's outputs are not checked against the metadata
    LiveR gives it. They go to the loss, not over the wire, and their dtype is what the user's loop
    makes it: under its autocast, bfloat16 logits, where the meta device (no autocast) works out
    float32. torch 2.11 checks them and refused a user's bf16 pipeline after a scale-out on NCCL
    (``PipeliningShapeError: Stage 1 forward outputs ... expected torch.float32 actual
    torch.bfloat16``, bench/results/gpu-1x-netns-nccl-two-nodes); later torch checks only the
    outputs it sends (and those only under TORCH_DISTRIBUTED_DEBUG=DETAIL), as this does."""
    from torch.distributed.pipelining import PipelineStage

    class Stage(PipelineStage):
        def _validate_fwd_outputs(self, outputs, *args, **kwargs):
            if not self.is_last:
                return super()._validate_fwd_outputs(outputs, *args, **kwargs)
            return None

    return Stage


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def model_facts(recipe: Recipe, job: JobConfig, specs) -> ModelFacts:
    """The recipe's facts (``Recipe.facts``) over the parameters and blocks of ``specs`` (the whole
    model's tensors); ValueError where the recipe returns something else."""
    facts = recipe.facts(job, sum(s.numel for s in specs if s.kind == "param"), blocks([s.name for s in specs]))
    if not isinstance(facts, ModelFacts):
        raise ValueError(f"recipe {recipe.name!r}: facts() returned {type(facts).__name__}; allowed a ModelFacts")
    return facts


class NativeEngine:
    """Rank ``world.rank`` of a recipe's job (see the module's docstring)."""

    def __init__(self, recipe: Recipe, job: JobConfig, world: World, device: torch.device, *,
                 initialise: bool = True, specs: list | None = None,
                 adopt: dict[str, torch.Tensor] | None = None, model: torch.nn.Module | None = None,
                 sharding: dict | None = None, boxes: dict[str, Box] | None = None, here: bool = True) -> None:
        """``specs``: every logical tensor of the layout, in one order on every rank (the
        adapter's; with pipeline stages a rank's own model names only its stage's). ``adopt``:
        the old generation's shards that stay on this process in the same box, used as this
        engine's storage (``build_model``). ``model``: its structure, made in Prepare;
        ``sharding``: DTensor's propagation on its mesh, worked out there (``ahead.py``).
        ``boxes``: this rank's box of each tensor it holds, from the layout's view (the adapter's,
        made once per layout); else each is worked out from its DTensor. ``here``: built in the
        thread that trains it; else in the companion, before the pause (``build_model``)."""
        self._view_boxes = boxes
        self.recipe, self.job, self.world, self.layout, self.device = recipe, job, world, world.layout, device
        self.model, self.optimizer, self.placed = build_model(recipe, job, world, device, adopt,
                                                              make_state=not initialise, model=model,
                                                              sharding=sharding, here=here)
        self.kinds = optimizer_state(recipe, job)
        self.scheduler = recipe.scheduler(self.optimizer, job)
        self.specs = list(specs) if specs is not None else [p.spec for p in self.placed]
        self._schedule = None  # the pipeline's (pp > 1), and its stage's input, made at the first step
        self._stage_input: torch.Tensor | None = None
        self._collect()
        self._made = not initialise  # (else the optimizer makes its state at its first step: collected then)
        self.step = 0
        self.consumed_samples = 0
        self.facts = model_facts(recipe, job, self.specs)  # (the whole model's, for MFU: the specs are every rank's)
        self._param_list = list(self.model.parameters())  # (a walk of the modules costs a step ~1 ms)
        self._named_params = [(n, p) for n, p in self.model.named_parameters()]
        self.mirror = None  # a pre-copy's (liver/runtime/mirror.py), set by the runtime while it mirrors
        self.optimizer.register_step_pre_hook(self._before_update)
        if initialise:
            self._initialise()

    def _collect(self) -> None:
        """``state`` and ``boxes``: this rank's local tensor and box of each logical tensor it holds."""
        self._tensors = self._by_name()
        self.boxes: dict[str, Box] = {}
        self.state: dict[str, torch.Tensor] = {}
        for p in self.placed:
            t = self._tensors.get(p.spec.name)
            if t is None:
                continue
            if self._view_boxes is None:
                box = local_box(p.spec.name, t)
            else:  # the view's, checked against the local tensor's shape
                box, local = self._view_boxes.get(p.spec.name), _local(t)
                if (box is None and local.numel() > 0) or \
                        (box is not None and tuple(local.shape) != tuple(hi - lo for lo, hi in box)):
                    raise RuntimeError(f"{p.spec.name}: the model's local tensor has shape {tuple(local.shape)}, "
                                       f"the layout's view gives this rank {box}")
            if box is not None:
                self.boxes[p.spec.name] = box
                self.state[p.spec.name] = _local(t)

    def _by_name(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        params = dict(self.model.named_parameters())
        for name, p in params.items():
            out[name] = p
            for key, v in self.optimizer.state.get(p, {}).items():
                if key in self.kinds.keys:
                    out[f"{name}.{key}"] = v
        out.update(persistent_buffers(self.model))
        return out

    def _initialise(self) -> None:
        """The state a plain one-process run of the model's own initialisation makes (``init.py``),
        each tensor cut to this rank's box: the same first state whatever the layout. The
        optimizer makes its own state at its first step."""
        own = None if type(self.recipe).init_weights is Recipe.init_weights else \
            (lambda m: self.recipe.init_weights(m, self.job))
        with torch.device("meta"):
            whole = self.recipe.model(self.job)
        wanted = {s.name for s in self.specs if s.kind in ("param", "buffer") and s.name in self.state}
        got = set()
        with torch.no_grad():
            for name, full in initial_values(whole, self.job.train.seed, own, wanted):
                self.state[name].copy_(full[tuple(slice(lo, hi) for lo, hi in self.boxes[name])])
                got.add(name)
        if wanted - got:
            raise ValueError(f"tensor {sorted(wanted - got)[0]!r} is not in the recipe {self.recipe.name!r}'s "
                             f"model as one process builds it: its initial value is unknown")

    def _before_update(self, optimizer, args, kwargs) -> None:
        """Right before the optimizer's step (the recipe's loop calls it): a pre-copy's mirror, if
        any, waits for its slice's copy and replays this update on its shards, from the gradients
        as the optimizer will read them (reduced, clipped) and its options and counters now."""
        if self.mirror is None:
            return
        self.mirror.before_update()
        grads = {n: _local(p.grad) for n, p in self._named_params if p.grad is not None and n in self.state}
        groups = tuple({k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups)
        self.mirror.after_update(grads, Update(step=self.step, lr=float(groups[0]["lr"]), groups=groups,
                                               counters=tuple(self._optimizer_scalars().items())))

    # ---- scalars -----------------------------------------------------------------------------
    def _optimizer_scalars(self) -> dict[str, float]:
        """The optimizer's 0-dim state (``step``, NAdam's ``mu_product``, ...), one value each."""
        out: dict[str, float] = {}
        for key, _ in self.kinds.scalars:
            values = {float(st[key]) for st in self.optimizer.state.values() if key in st}
            if len(values) > 1:
                raise ValueError(f"optimizer {self.kinds.optimizer} state {key!r} differs between parameters "
                                 f"({sorted(values)[:4]}): LiveR carries one value of it for the whole optimizer")
            if values:
                out[key] = values.pop()
        return out

    def scalars(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "consumed_samples": self.consumed_samples,
                               "seed": self.job.train.seed, "optimizer": self._optimizer_scalars(),
                               "lr": [float(g["lr"]) for g in self.optimizer.param_groups]}
        if self.scheduler is not None:
            out["scheduler"] = {k: v for k, v in self.scheduler.state_dict().items()
                                if isinstance(v, (int, float, str, bool, list)) or v is None}
        return out

    def load_scalars(self, s: dict[str, Any]) -> None:
        if s["seed"] != self.job.train.seed:
            raise ValueError(f"scalars.seed={s['seed']} differs from the job's train.seed={self.job.train.seed}")
        self.step = int(s["step"])
        self.consumed_samples = int(s["consumed_samples"])
        for st in self.optimizer.state.values():
            for key, value in s["optimizer"].items():
                if key in st:
                    st[key].fill_(value)
        for g, lr in zip(self.optimizer.param_groups, s["lr"]):
            g["lr"] = lr
        if self.scheduler is not None and "scheduler" in s:
            self.scheduler.load_state_dict({**self.scheduler.state_dict(), **s["scheduler"]})

    def refresh(self) -> None:
        """The parameters are the state (no compute copies): nothing to re-derive."""

    def align_replicas(self) -> None:
        """DTensor keeps a replicated parameter's copies equal (its gradient is reduced to a
        replicated one before the update): nothing to align."""

    def release_compute(self) -> None:
        """Gradients and FSDP's unsharded parameters are gone at a boundary: nothing to let go."""
        self.drop_grads()

    def drop_grads(self) -> None:
        for p in self._param_list:  # (model.zero_grad's, without its walk of the modules)
            if p.grad is not None:
                p.grad = None

    def held_grads(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if p.grad is not None]

    def unaccounted(self) -> list[str]:
        """Optimizer state of keys its description lacks, and persistent buffers outside the specs:
        neither would be moved."""
        out, known = [], {s.name for s in self.specs}
        keys = set(self.kinds.keys) | {k for k, _ in self.kinds.scalars}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, st in self.optimizer.state.items():
            out += [f"{names.get(id(p), 'a parameter')}.{k} (optimizer state)" for k, v in st.items()
                    if k not in keys and isinstance(v, torch.Tensor)]
        out += [f"{n} (persistent buffer)" for n, _ in persistent_buffers(self.model) if n not in known]
        return out

    # ---- training ----------------------------------------------------------------------------
    def train_step(self) -> StepStats:
        """The recipe's ``train_step`` (or, with pipeline stages, the schedule's), as one step."""
        t0 = time.perf_counter()
        inputs, targets = self.batch()
        if self.layout.pp > 1:
            loss = self.schedule_step(inputs, targets)
            norm = self.clip_grad_norm(self.job.train.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        else:
            loss, norm = self.recipe.train_step(self.model, self.optimizer, inputs, targets, self.job)
        return self.finish(loss, norm, t0)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's inputs and targets for the next step, on the device; the model in train mode."""
        faults.here("mid-step", self.step + 1)  # (the fault matrix's peer lost in a step; unset: a no-op)
        c = self.world.coord
        inputs, targets = self.recipe.batch(self.job, c.dp, self.layout.dp, self.consumed_samples)
        if not self.model.training:  # (a loop that evaluated: train mode again; a walk of the modules)
            self.model.train()
        # contiguous: a recipe's batch may be a view (tokens[:, :-1]); torch 2.11's pipeline stage
        # checks its input's strides against the contiguous activations it was given
        return inputs.to(self.device).contiguous(), targets.to(self.device).contiguous()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The gradients' global norm over every stage, clipped to ``max_norm`` (0: not clipped)."""
        return clip_grad_norm(self.model.parameters(), max_norm, stages=self.world.pp if self.layout.pp > 1 else None)

    def finish(self, loss: torch.Tensor, norm: float, t0: float) -> StepStats:
        """The step taken (the optimizer has stepped): the LR schedule, the counters, and the loss
        averaged over the data-parallel ranks (from the last stage, with pipeline stages)."""
        job = self.job
        lr = float(self.optimizer.param_groups[0]["lr"])
        if self.scheduler is not None:
            self.scheduler.step()
        if not self._made:  # the optimizer made its state at this first step
            self._collect()
            self._made = True
        # the state moved on: so do the counters, before the loss's collective (a peer that vanishes
        # in it leaves state and counters agreeing)
        self.step += 1
        self.consumed_samples += job.train.global_batch
        if isinstance(loss, DTensor):
            loss = loss.full_tensor()
        # on the device, no wait for it here: the step's one wait is for the sum below
        total = loss.detach().to(self.device, torch.float64, copy=True).reshape(1) if isinstance(loss, torch.Tensor) \
            else torch.tensor([float(loss)], dtype=torch.float64, device=self.device)
        self.world.dp.allreduce(total)
        if self.layout.pp > 1:  # (only the last stage has the loss)
            self.world.pp.allreduce(total)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        tokens = job.train.global_batch * self.facts.seq_len
        mfu = model_flops_utilisation(self.facts.flops_per_token, tokens / dt, peak_flops(self.device, job.compute_dtype),
                                      self.layout.size)
        return StepStats(self.step, float(total.item()) / self.layout.dp, float(norm), lr, dt, tokens / dt, mfu)

    def schedule_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one step over this generation's pipeline (GPipe over the
        layout's micro-batches, the recipe's ``criterion`` on the last stage; made before, in
        Prepare, or at its first step: ``_pipeline``). Returns the mean loss on the last stage, 0
        on the others. On a fake World (a joiner's warm-up, the template's rehearsal) each
        micro-batch runs through this stage alone: the same kernels and DTensor collectives, no
        pipeline messages (no peer exists to answer them)."""
        lay, c = self.layout, self.world.coord
        first, last = c.pp == 0, c.pp == lay.pp - 1
        micro = lay.num_micro_batches
        n = inputs.shape[0] // micro
        if self._stage_input is None:
            self._pipeline(inputs[:n])
        losses: list[torch.Tensor] = []
        if self._schedule is not None:
            kw = {"target": targets, "losses": losses} if last else {}
            self._schedule.step(*([inputs] if first else []), **kw)
        else:  # (a fake World)
            for i in range(micro):
                out = self.model(inputs[i * n:(i + 1) * n] if first else self._stage_input)
                part = self.recipe.criterion(out, targets[i * n:(i + 1) * n]) if last else out.float().sum() * 0.0
                (part / micro).backward()
                losses.append(part)
        return torch.stack([x.detach().float() for x in losses]).mean() if last else torch.zeros(())

    def prepare_pipeline(self) -> None:
        """With pipeline stages: this stage's schedule made now, from a batch's shape (Prepare
        calls it on the engine it makes, so the first step after the switch does not)."""
        if self.layout.pp > 1 and self._stage_input is None:
            c = self.world.coord
            inputs, _ = self.recipe.batch(self.job, c.dp, self.layout.dp, 0)
            self._pipeline(inputs[: inputs.shape[0] // self.layout.num_micro_batches].to(self.device))

    def _pipeline(self, micro_inputs: torch.Tensor) -> None:
        """This stage's input example (its activations' shapes, worked out on the meta device:
        no shape inference over the wire) and, on a real World, its schedule: GPipe over the
        layout's micro-batches, the recipe's ``criterion`` on the last stage."""
        from torch.distributed.pipelining import ScheduleGPipe

        lay, c = self.layout, self.world.coord
        first, last = c.pp == 0, c.pp == lay.pp - 1
        x, y = (torch.zeros(t.shape, dtype=t.dtype, device=self.device)
                for t in stage_activations(self.recipe, self.job, lay, c.pp, micro_inputs, fsdp_compute_dtype(self.model)))
        # activations between stages carry gradients back: as examples they must require them
        # (else the stage before gets none, and trains on nothing)
        x.requires_grad_(not first and x.is_floating_point())
        y.requires_grad_(not last and y.is_floating_point())
        if not last and y.is_floating_point():
            self.model.register_forward_hook(_as_sent(y.dtype))
        if not isinstance(self.world, FakeWorld):
            meta = {"input_args": x, "output_args": y,  # (the gradients' too where torch takes them)
                    "output_grads": (None if last else y,), "input_grads": (None if first else x,)}
            Stage = _stage_class()
            takes = inspect.signature(Stage).parameters
            stage = Stage(self.model, c.pp, lay.pp, self.device, group=self.world.mesh()["pp"].get_group(),
                                  **{k: v for k, v in meta.items() if k in takes})
            self._schedule = ScheduleGPipe(stage, n_microbatches=lay.num_micro_batches, loss_fn=self.recipe.criterion)
        self._stage_input = x

    # ---- checkpoints -------------------------------------------------------------------------
    def checkpoint_tensors(self, tensors: dict[str, torch.Tensor] | None = None,
                           cpu: bool = False) -> dict[str, torch.Tensor]:
        """DCP's view of the state: each logical tensor as a DTensor with this rank's shard
        (``tensors`` instead of the engine's own: a snapshot on the host, on a CPU mesh)."""
        tensors = self.state if tensors is None else tensors
        # (a CPU mesh only where the device is not the CPU: equal meshes share DTensor's caches)
        root = self.world.mesh(cpu=cpu and self.device.type != "cpu")
        out: dict[str, torch.Tensor] = {}
        for p in self.placed:
            if p.spec.name not in tensors:
                continue
            t = tensors[p.spec.name]
            if p.placements:
                mesh = root[p.mesh_dims] if len(p.mesh_dims) > 1 else root[p.mesh_dims[0]]
                t = DTensor.from_local(t, mesh, list(p.placements), run_check=False, shape=torch.Size(p.spec.shape),
                                       stride=torch.empty(p.spec.shape, device="meta").stride())
            out[p.spec.name] = t
        return out
