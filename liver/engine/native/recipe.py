"""The public API for a user's own PyTorch-native training: a ``Recipe``.

A recipe says how to build the model (on the meta device: LiveR allocates its storage once, in
the layout it is parallelised to), how to cut it into a pipeline stage (``stage``, where pp > 1:
this stage's blocks under their own names, ``torch.distributed.pipelining`` then runs the
schedule), how to parallelise it over the mesh LiveR gives (the user's own ``parallelize``:
``parallelize_module`` plans over ``mesh["tp"]``, ``fully_shard`` over ``mesh["dp"]``), the
optimizer, this data-parallel rank's part of the batch at a given position in the data, and one
iteration of the user's loop (``train_step``), or the loop itself (``loop``: the user's own
``for step in steps``). LiveR owns generations, meshes, the cut and the switch: between two
iterations it may rebuild the model and optimizer for another mesh with the state moved over
bit for bit. A cold joiner's warm-up and the rehearsals run the same loop for a step or two on a
mock world.

What a recipe must not do: keep tensors of a model or optimizer it was given across calls (after
a switch they belong to a mesh that no longer exists), build process groups or meshes of its own
(``init_process_group``, ``init_device_mesh``), or read the process-global default group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from liver.engine.native.resource import sharded
from liver.topology import JobConfig, ModelConfig, ModelFacts, ParallelConfig


class Recipe(ABC):
    """One kind of user model; stateless (LiveR may call any method in any process).

    ``config``: the model's configuration, a frozen dataclass that the job file's ``[job.model]``
    table fills (each field's type checked, an unknown key refused naming it; its own
    ``__post_init__`` checks its values, raising ``ValueError`` naming the field); ``job.model`` is
    one. By default the presets' Llama-shaped ``ModelConfig``, whose fields a preset fills."""

    name: str = "native"
    config: ClassVar[type] = ModelConfig

    @abstractmethod
    def model(self, job: JobConfig) -> nn.Module:
        """The whole model, unparallelised; called under ``torch.device("meta")``."""

    @abstractmethod
    def parallelize(self, model: nn.Module, mesh: DeviceMesh, job: JobConfig) -> nn.Module:
        """Lay ``model`` out over ``mesh`` (dimensions "pp", "dp", "tp"); returns the model."""

    @abstractmethod
    def optimizer(self, model: nn.Module, job: JobConfig) -> torch.optim.Optimizer:
        """The optimizer over the parallelised model's parameters."""

    @abstractmethod
    def batch(self, job: JobConfig, dp_rank: int, dp_size: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's inputs and targets for the step that starts at sample
        ``position`` of the data (``job.train.global_batch`` samples a step, split over
        ``dp_size`` ranks). Must depend on nothing else, so that any layout sees the same data."""

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of the model's outputs against the targets (the last pipeline stage's
        loss function; ``loss`` by default)."""
        raise NotImplementedError(f"recipe {self.name!r}: define criterion(outputs, targets) (or loss)")

    def loss(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of this rank's batch (without pipeline stages)."""
        return self.criterion(model(inputs), targets)

    def stage(self, model: nn.Module, layers: range, first: bool, last: bool) -> nn.Module:
        """Pipeline parallelism (pp > 1): the part of ``model`` (on the meta device, not yet
        parallelised) that the stage holding the transformer blocks ``layers`` runs; ``first``: it
        takes the inputs (the embedding), ``last``: it makes the outputs (the head). Keep each
        kept tensor's qualified name (delete the blocks of other stages, set the embedding or the
        head to None): every stage names its tensors as the whole model does, so that state moves
        between any stage splits. Its forward maps the previous stage's output (or the inputs) to
        the next one's input (or the outputs)."""
        raise ValueError(f"parallel.pp > 1: recipe {self.name!r} defines no stage() (how to cut its model "
                         f"into pipeline stages); allowed pp=1")

    @classmethod
    def pipelines(cls) -> bool:
        """Whether the recipe can cut its model into pipeline stages."""
        return cls.stage is not Recipe.stage

    def init_weights(self, model: nn.Module, job: JobConfig) -> None:
        """The model's initialisation, TorchTitan's way, where the recipe overrides this: run once,
        in one process, on CPU, over the whole model built on the meta device and given storage,
        after ``torch.manual_seed(job.train.seed)`` (liver/engine/native/init.py). By default each
        module's own ``reset_parameters`` (else ``reset_running_stats``) runs, in the order the
        modules are made: the values a plain ``torch.manual_seed(seed); Model(...)`` run gives."""

    def init_buffers(self, model: nn.Module, job: JobConfig) -> None:
        """Compute the non-persistent buffers (a RoPE cache) of a model that just got its storage
        (every generation's, not state: never moved). One left unset is refused, naming it."""

    def scheduler(self, optimizer: torch.optim.Optimizer, job: JobConfig) -> torch.optim.lr_scheduler.LRScheduler | None:
        """An LR schedule stepped after every iteration (its state travels with the scalars)."""
        return None

    def check(self, job: JobConfig, parallel: ParallelConfig) -> None:
        """The model's own constraints on a layout (ValueError naming the field)."""

    def facts(self, job: JobConfig, params: int, layers: int) -> ModelFacts:
        """What LiveR's layout checks, target choice, cost model and MFU know of the model:
        ``params`` and ``layers`` are counted on the model itself (its parameters; its blocks,
        named ``layers.N``). By default a decoder (``ModelFacts.decoder``) of a ``ModelConfig``'s
        hidden size and sequence length; a recipe with a configuration of its own says its width
        and tokens a sample (or other FLOPs a token)."""
        m = job.model
        if not isinstance(m, ModelConfig):
            raise ValueError(f"recipe {self.name!r}: its model configuration {type(m).__name__} is its own; define "
                             f"facts(job, params, layers) (ModelFacts.decoder(params, layers, width, seq_len))")
        return ModelFacts.decoder(params, layers, m.hidden_size, m.seq_len)

    def rehearsal_job(self) -> JobConfig:
        """A small job of this model, for rehearsals of the code paths (default: the tiny preset,
        its model the configuration's defaults where the recipe has a configuration of its own)."""
        from liver.topology.presets import preset
        tiny = preset("tiny")
        if self.config is ModelConfig:
            return tiny
        try:
            return JobConfig(model=self.config(), train=tiny.train)
        except TypeError:
            raise ValueError(f"recipe {self.name!r}: {self.config.__name__} has fields without defaults; define "
                             f"rehearsal_job() (a small job of this model)") from None

    def loop(self, steps) -> None:
        """The training loop, the recipe's own where it overrides this: ``steps`` yields one
        ``NativeStep`` an iteration (liver/engine/native/step.py: this generation's model and
        optimizer, this rank's inputs and targets), across every switch; LiveR takes the boundary
        between two iterations. Each iteration's body runs ``with step:`` (a peer lost mid-step
        is healed and the iteration run again) and ends with ``step.done(loss, grad_norm)``, or
        ``step.run()`` (``train_step``, as here). It must not keep the model, the optimizer or
        their tensors across iterations, nor leave the loop before ``steps`` ends. A process may run
        it more than once (a cold joiner's warm-up on a mock world first, a few iterations): keep
        what comes after the loop free of effects beyond the process."""
        steps.run_all()

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                   targets: torch.Tensor, job: JobConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """One iteration of the loop: forward, backward, gradient clipping, optimizer step.
        Returns this rank's loss and the global gradient norm (tensors: read once the step ends).
        Override for another loop body."""
        loss = self.loss(model, inputs, targets)
        loss.backward()
        norm = clip_grad_norm(model.parameters(), job.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach(), norm


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float, stages=None) -> torch.Tensor:
    """The global L2 norm of the gradients (a 0-dim float64 tensor on their device: ``float(norm)``
    waits for it), all of them scaled by ``min(1, max_norm / norm)`` (0: no clipping). Works for
    plain tensors and DTensors on several meshes at once (``torch.nn.utils.clip_grad_norm_``
    refuses the mix), with no wait for the device: each group of gradients with the same mesh and
    sharded dimensions sums its local squares, then all-reduces once over each dimension it is
    sharded on. ``stages``: the pipeline's group (a LiveR ``Group``), whose stages' sums add up."""
    grads = [p.grad for p in params if p.grad is not None]
    groups: dict[tuple, list[torch.Tensor]] = {}
    reduce_over: dict[tuple, list] = {}
    for g in grads:
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):  # (a pending reduction: do it first)
                g = g.redistribute(placements=[Replicate() if pl.is_partial() else pl for pl in g.placements])
            dims = tuple(i for i, pl in enumerate(g.placements) if sharded(pl))
            # (the mesh by its dimensions' names and sizes, as every rank names it, not by the
            # object's identity: the keys, so the all-reduces, come in one order on every rank)
            mesh = g.device_mesh
            key = (tuple(mesh.mesh_dim_names or ()), tuple(mesh.mesh.shape), dims)
            reduce_over.setdefault(key, [mesh.get_group(i) for i in dims])
            groups.setdefault(key, []).append(g._local_tensor)
        else:
            groups.setdefault((), []).append(g)
            reduce_over.setdefault((), [])
    device = next(iter(groups.values()))[0].device if groups else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float64, device=device)
    for key in sorted(groups, key=repr):  # (in one order on every rank: the collectives pair up)
        local = groups[key]
        norms = torch._foreach_norm([t if t.dtype == torch.float32 else t.float() for t in local])
        sq = torch.stack(norms).double().pow(2).sum()
        for pg in reduce_over[key]:
            torch.distributed.all_reduce(sq, group=pg)
        total += sq.to(device)
    if stages is not None and stages.size > 1:
        t = total.reshape(1).to(stages.device)
        stages.allreduce(t)
        total = t.to(device).reshape(())
    norm = total.sqrt()
    if max_norm > 0 and grads:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for local in groups.values():
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for t in local:
                by_dtype.setdefault(t.dtype, []).append(t)
            with torch.no_grad():
                for dtype, ts in by_dtype.items():
                    torch._foreach_mul_(ts, coef.to(dtype=dtype, device=ts[0].device))
    return norm
