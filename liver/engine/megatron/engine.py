"""One rank of a Megatron-Core GPT job: its model stage on the World's groups, its state as the
Resource View names it (``view.Shard``), its optimizer moments and its training step.

The model is Megatron's own (``model.gpt``: its layers, its tensor parallelism and initialisation);
what Megatron-Core 0.16 asks of CUDA for the rest is done here where the device is a CPU:

- the pipeline schedule is LiveR's 1F1B (``liver.engine.reference.pipeline``) over the World's
  PP group: Megatron's own asks for a P2P communicator on "cuda" (``schedules.py``);
- data parallelism is one all-reduce of the gradients over the World's DP group (Megatron's DDP
  makes groups of its own and its buffers on CUDA), then AdamW over the fp32 main weights with
  the moments as state tensors (Megatron's optimizer wraps CUDA tensors). In fp32 the main
  weights are the parameters; in bf16 (``job.compute_dtype``) the parameters are bf16 copies of
  them, made again after each update.

The state of a rank: every piece of the model's ``sharded_state_dict`` (a view of its main weight:
a SwiGLU weight's two halves are two pieces) and, for each, the same view of its two AdamW
moments; the scalars of ``liver.engine.scalars``. All of it moves live, and through a checkpoint.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from liver.data import tokens_of
from liver.engine import scalars as train_scalars
from liver.engine.flops import mfu as model_flops_utilisation, peak_flops
from liver.engine.interface import StepStats
from liver.engine.megatron import cpu
from liver.engine.megatron.model import gpt, world_collection
from liver.engine.megatron.view import Shard, shards
from liver.engine.reference.optim import OPTIMIZER_KINDS, adamw_step, learning_rate
from liver.engine.reference.pipeline import OneFOneB
from liver.engine.tp_checkpoint import tp_dtensors
from liver.host import faults
from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box, local_shape
from liver.topology.config import JobConfig
from liver.world.world import World


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def owner(t: torch.Tensor, params: list[torch.Tensor]) -> int:
    """The index of the parameter whose elements ``t`` (a view: a piece of Megatron's sharded
    state) lies in; parameters may share a storage (Megatron's DDP lays them in one buffer)."""
    lo = t.data_ptr()
    for i, p in enumerate(params):
        start = p.data_ptr()
        if start <= lo < start + p.numel() * p.element_size():
            return i
    raise ValueError(f"megatron: a piece of the sharded state (shape {list(t.shape)}) is in no parameter")


def cut(t: torch.Tensor, part: tuple[int, int, int] | None) -> torch.Tensor:
    """The piece of a rank's local tensor that a ``Shard`` names (``part``: axis, index, chunks)."""
    if part is None:
        return t
    axis, i, n = part
    return t.chunk(n, axis)[i]


class MegatronEngine:
    """One rank of a TP x PP x DP Megatron-Core GPT job."""

    def __init__(self, job: JobConfig, world: World, device: torch.device, specs: list[TensorSpec],
                 flops_per_token: float, *, initialise: bool = True,
                 state: dict[str, torch.Tensor] | None = None) -> None:
        """Rank ``world.rank``'s stage: initialised as Megatron does (``initialise``; its CPU
        initialisation from the job's seed), uninitialised (to be loaded), or given ``state``
        (shards in this layout: copied into the model's tensors)."""
        cpu.install(device)
        cpu.memory_buffer()  # (a GPU's too: this engine never calls initialize_model_parallel)
        self.job, self.world, self.layout, self.device = job, world, world.layout, device
        self.specs = specs
        self._flops_per_token = flops_per_token
        cfg = job.model
        c = self.layout.coord(world.rank)
        self.compute_dtype = _DTYPES[job.compute_dtype]
        # Megatron's seeding (``model_parallel_cuda_manual_seed``'s), on every build: its
        # initialisation draws from it, and its layers fork the TP state whatever they load
        cpu.seed(job.train.seed, c.tp)
        with torch.device(device):
            self.model = gpt(cfg, self.layout.parallel, list(self.layout.layers_per_stage), c.pp,
                             world_collection(world), self.compute_dtype,
                             perform_initialization=initialise and state is None)
        if self.compute_dtype != torch.float32:  # every parameter in it, norms too (as Megatron's Float16Module)
            self.model.to(self.compute_dtype)
        self.first_stage, self.last_stage = c.pp == 0, c.pp == self.layout.pp - 1
        self.params = [p for p in self.model.parameters()]
        self.main, self.moments = self._optimizer_state()
        self.pieces: list[Shard] = shards(self.model, world.process_group("dp"), cfg.num_layers)
        self.boxes: dict[str, Box] = {}
        self.state: dict[str, torch.Tensor] = {}
        for s in self.pieces:
            i = owner(s.data, self.params)
            self.boxes[s.name] = s.box
            self.state[s.name] = cut(self.main[i], s.part)
            for kind in OPTIMIZER_KINDS:
                self.boxes[f"{s.name}.{kind}"] = s.box
                self.state[f"{s.name}.{kind}"] = cut(self.moments[kind][i], s.part)
        if set(self.state) - {s.name for s in specs}:
            raise ValueError(f"megatron: rank {world.rank} holds tensors the job's specs do not name: "
                             f"{sorted(set(self.state) - {s.name for s in specs})[:4]}")
        if state is not None:
            with torch.no_grad():
                for name, t in self.state.items():
                    given = state[name]
                    if tuple(given.shape) != local_shape(self.boxes[name]):
                        raise ValueError(f"state[{name!r}] has shape {tuple(given.shape)}; this rank's shard under "
                                         f"{self.layout.parallel.short()} is {local_shape(self.boxes[name])}")
                    t.copy_(given)
            self.refresh()
        # a parameter split over TP counts on every TP rank in the gradient's norm, a replicated one once
        self._counted = [p.tensor_model_parallel or world.tp.rank == 0 for p in self.params]
        self._decay = [p.dim() > 1 for p in self.params]
        self._mask = cpu.causal_mask(cfg.seq_length, device)
        self.step = 0
        self.consumed_samples = 0

    def _optimizer_state(self) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
        """Each parameter's main weight and AdamW moments (tensors of its shape): the parameter
        itself in fp32, else an fp32 copy of it (the state; the parameters are their compute
        copies, ``refresh``), and zeros."""
        main = [p.detach() if p.dtype == torch.float32 else p.detach().float() for p in self.params]
        return main, {kind: [torch.zeros_like(m, memory_format=torch.contiguous_format) for m in main]
                      for kind in OPTIMIZER_KINDS}

    # ---- what the runtime asks of an engine -------------------------------------------------
    def drop_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def held_grads(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if p.grad is not None]

    def unaccounted(self) -> list[str]:
        """Every parameter's pieces and both moments are state; the model's buffers (RoPE's
        frequencies) are computed from the configuration."""
        buffers = dict(self.model.named_buffers())
        return [n for n in self.model.state_dict(keep_vars=True) if n in buffers]

    def release_compute(self) -> None:
        """The parameters are the model's (its modules hold them): they go with the old engine."""

    @torch.no_grad()
    def align_replicas(self) -> None:
        """Megatron does not keep its TP ranks' copies of a replicated parameter (a norm's weight)
        equal: each rank computes its gradient apart (only with sequence parallelism are they
        all-reduced), and on GPUs the copies were seen to differ after one step
        (bench/results/gpu-1x-netns-nccl-two-nodes). Its checkpoint saves TP rank 0's copy (the main
        replica) and a restart loads it on every rank; this does the same at a boundary, so that a
        live handoff carries what a restart would: TP rank 0's main weight and moments of every
        replicated parameter, to each rank of its TP group in one broadcast, the compute copies
        re-derived."""
        tp = self.world.tp
        if tp.size == 1:
            return
        mine = [t for i, p in enumerate(self.params) if not p.tensor_model_parallel
                for t in (self.main[i], *(self.moments[kind][i] for kind in OPTIMIZER_KINDS))]
        if not mine:
            return
        flat = torch.cat([t.reshape(-1) for t in mine])
        tp.broadcast(flat, src=0)
        offset = 0
        for t in mine:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """The compute copies from the main weights (fp32: they are the same tensors)."""
        for p, m in zip(self.params, self.main):
            if p.data_ptr() != m.data_ptr():
                p.copy_(m)

    def checkpoint_tensors(self, tensors: dict[str, torch.Tensor] | None = None,
                           cpu: bool = False) -> dict[str, torch.Tensor]:
        tp = self.world.cpu_groups["tp"] if cpu else self.world.tp
        return tp_dtensors(self.specs, self.state if tensors is None else tensors, tp)

    def scalars(self) -> dict[str, Any]:
        return train_scalars.of(self.job.train, self.step, self.consumed_samples)

    def load_scalars(self, s: dict[str, Any]) -> None:
        self.step, self.consumed_samples = train_scalars.load(self.job.train, s)

    # ---- training ----------------------------------------------------------------------------
    def train_step(self) -> StepStats:
        t0 = time.perf_counter()
        job, lay, w = self.job, self.layout, self.world
        cfg, tr = job.model, job.train
        c = lay.coord(w.rank)
        n_micro, mb = lay.num_micro_batches, tr.micro_batch
        first_sample = self.consumed_samples + c.dp * lay.local_batch
        scale = 1.0 / (n_micro * lay.dp)
        positions = torch.arange(cfg.seq_length, device=self.device).unsqueeze(0).expand(mb, -1)

        def forward(i: int, x: torch.Tensor | None) -> torch.Tensor:
            ids, tgt = self._micro_batch(first_sample + i * mb)
            if not self.first_stage:
                self.model.set_input_tensor(x)
            out = self.model(ids, positions, self._mask)
            if self.last_stage:
                return F.cross_entropy(out.float().reshape(-1, cfg.vocab_size), tgt.reshape(-1)) * scale
            return out

        sched = OneFOneB(w.pp, (cfg.seq_length, mb, cfg.hidden_size), self.compute_dtype, self.device)
        losses = sched.run(forward, n_micro)
        faults.here("mid-step", self.step + 1)

        loss = torch.tensor([sum(losses)], dtype=torch.float64, device=self.device)
        w.dp.allreduce(loss)
        w.pp.allreduce(loss)
        grads = [p.grad.float() if p.grad is not None else torch.zeros_like(m) for p, m in zip(self.params, self.main)]
        if lay.dp > 1:
            flat = torch._utils._flatten_dense_tensors(grads)
            w.dp.allreduce(flat)
            grads = list(torch._utils._unflatten_dense_tensors(flat, grads))
        faults.here("reduced", self.step + 1)
        norm = self._grad_norm(grads)
        clip = min(1.0, tr.grad_clip / (norm + 1e-6)) if tr.grad_clip > 0 else 1.0
        lr = learning_rate(tr, self.step)
        adamw_step(self.main, grads, self.moments["exp_avg"], self.moments["exp_avg_sq"], self._decay,
                   tr, self.step, lr, clip)
        self.refresh()
        self.drop_grads()
        return self._stepped(t0, float(loss.item()), norm, lr)

    def _micro_batch(self, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch of the corpus from global sample ``first``: its tokens and their targets."""
        cfg, tr = self.job.model, self.job.train
        win = torch.from_numpy(tokens_of(tr).windows(first, tr.micro_batch, cfg.seq_length + 1, tr.seed)
                               % cfg.vocab_size).to(self.device)
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def _stepped(self, t0: float, loss: float, norm: float, lr: float) -> StepStats:
        """A step's end: the counters moved on, and its statistics (started at ``t0``)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        tr = self.job.train
        self.step += 1
        self.consumed_samples += tr.global_batch
        dt = time.perf_counter() - t0
        tokens = tr.global_batch * self.job.model.seq_length
        mfu = model_flops_utilisation(self._flops_per_token, tokens / dt,
                                      peak_flops(self.device, self.job.compute_dtype), self.layout.size)
        return StepStats(self.step, loss, norm, lr, dt, tokens / dt, mfu)

    def _grad_norm(self, grads: list[torch.Tensor]) -> float:
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for counted, g in zip(self._counted, grads):
            if counted:
                total += g.double().pow(2).sum()
        self.world.tp.allreduce(total)
        self.world.pp.allreduce(total)
        return math.sqrt(float(total.item()))
