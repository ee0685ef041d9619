"""The reference training engine: one rank's shards, its optimizer state and its training step.

The engine gets all its process groups from the World it is handed. Its full training state is
the logical tensors of ``state_specs`` (fp32 master parameters and AdamW moments) plus the
scalars (step, data position, seed, LR schedule).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from liver.engine import scalars as train_scalars
from liver.engine.flops import mfu as model_flops_utilisation, peak_flops
from liver.engine.interface import StepStats, Update
from liver.host import faults
from liver.data import tokens_of
from liver.engine.reference import model
from liver.engine.reference.optim import adamw_step, learning_rate, with_adam_state
from liver.engine.reference.pipeline import OneFOneB
from liver.engine.tp_checkpoint import tp_dtensors
from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box, local_shape, view
from liver.topology.config import JobConfig
from liver.world.world import World

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def state_specs(job: JobConfig) -> list[TensorSpec]:
    """The full logical training state: every parameter followed by its two AdamW moments."""
    return with_adam_state(model.param_specs(job.model))


class Engine:
    """One rank of a TP x PP x DP training job."""

    def __init__(self, job: JobConfig, world: World, device: torch.device, *,
                 initialise: bool = True, state: dict[str, torch.Tensor] | None = None) -> None:
        """Create this rank's shards (``initialise``: from the seed; else uninitialised), or adopt
        ``state`` (shards already in this layout, e.g. delivered by a live transfer)."""
        self.job = job
        self.world = world
        self.layout = world.layout
        self.device = device
        self.compute_dtype = _DTYPES[job.compute_dtype]
        self.specs = state_specs(job)
        self._flops_per_token = job.model.facts().flops_per_token  # (for MFU)
        self.param_specs = [s for s in self.specs if s.kind == "param"]
        self.boxes: dict[str, Box] = {}
        for s in self.specs:
            b = view(s, self.layout, world.rank)
            if b is not None:
                self.boxes[s.name] = b
        self.local_params = [s for s in self.param_specs if s.name in self.boxes]
        # fp32 master state, created directly on this rank's device, shard by shard.
        self.state: dict[str, torch.Tensor] = {}
        for s in self.specs:
            if s.name not in self.boxes:
                continue
            box = self.boxes[s.name]
            if state is not None:
                t = state[s.name]
                if tuple(t.shape) != local_shape(box):
                    raise ValueError(f"state[{s.name!r}] has shape {tuple(t.shape)}; this rank's "
                                     f"shard under {self.layout.parallel.short()} is {local_shape(box)}")
            elif s.kind == "param" and initialise:
                t = model.init_shard(s, box, job.model, job.train.seed, device)
            elif initialise:
                t = torch.zeros(local_shape(box), dtype=torch.float32, device=device)
            else:
                t = torch.empty(local_shape(box), dtype=torch.float32, device=device)
            self.state[s.name] = t
        self.step = 0
        self.consumed_samples = 0
        self.mirror = None  # a pre-copy's (liver/runtime/mirror.py), set by the runtime while it mirrors
        self._bind_params()
        self._rope = model.rope_tables(job.model, device)

    def _bind_params(self) -> None:
        """Compute-dtype leaves for autograd; in fp32 they are the master tensors themselves."""
        self.params: dict[str, torch.Tensor] = {}
        for s in self.local_params:
            master = self.state[s.name]
            p = master if self.compute_dtype == torch.float32 else master.to(self.compute_dtype)
            p.grad = None  # (an adopted master may carry one from an attempt that a lost peer aborted)
            self.params[s.name] = p.requires_grad_(True)

    def drop_grads(self) -> None:
        for p in self.params.values():
            p.grad = None

    def held_grads(self) -> list[str]:
        return [n for n, p in self.params.items() if p.grad is not None]

    def unaccounted(self) -> list[str]:
        """The state is every parameter and both AdamW moments; nothing else carries over a step."""
        return []

    def align_replicas(self) -> None:
        """Replicas never drift here: a TP group's copies of a norm weight get the same all-reduced
        gradient, data-parallel replicas the same averaged one, and the same update."""

    def release_compute(self) -> None:
        """The compute-dtype copies go before the state is streamed away (its shards go layer by
        layer as they are sent: bounded extra memory, invariant I2)."""
        self.params = {}

    def refresh(self) -> None:
        """Re-derive compute weights after the master state was overwritten (load, transfer)."""
        if self.compute_dtype != torch.float32:
            with torch.no_grad():
                for s in self.local_params:
                    self.params[s.name].copy_(self.state[s.name])

    # ---- checkpoints -------------------------------------------------------------------------
    def checkpoint_tensors(self, tensors: dict[str, torch.Tensor] | None = None,
                           cpu: bool = False) -> dict[str, torch.Tensor]:
        """TP shards as DTensors over the World's TP group (its CPU one for a host snapshot:
        ``cpu``); replicated tensors plain. ``tensors`` replaces the engine's own."""
        tp = self.world.cpu_groups["tp"] if cpu else self.world.tp
        return tp_dtensors(self.specs, self.state if tensors is None else tensors, tp)

    # ---- scalars -----------------------------------------------------------------------------
    def scalars(self) -> dict[str, Any]:
        return train_scalars.of(self.job.train, self.step, self.consumed_samples)

    def load_scalars(self, s: dict[str, Any]) -> None:
        self.step, self.consumed_samples = train_scalars.load(self.job.train, s)

    # ---- training ----------------------------------------------------------------------------
    def train_step(self) -> StepStats:
        t0 = time.perf_counter()
        job, lay, w = self.job, self.layout, self.world
        m, tr = job.model, job.train
        c = lay.coord(w.rank)
        lo, hi = lay.stage_bounds[c.pp]
        first_stage, last_stage = c.pp == 0, c.pp == lay.pp - 1
        n_micro, mb = lay.num_micro_batches, tr.micro_batch
        first_sample = self.consumed_samples + c.dp * lay.local_batch
        scale = 1.0 / (n_micro * lay.dp)
        p = self.params

        def forward(i: int, x: torch.Tensor | None) -> torch.Tensor:
            win = torch.from_numpy(tokens_of(tr).windows(first_sample + i * mb, mb, m.seq_len + 1, tr.seed)
                                   % m.vocab_size)
            ids, tgt = win[:, :-1].contiguous(), win[:, 1:].contiguous()
            if first_stage:
                x = model.embed(ids.to(self.device), p, w.tp)
            for layer in range(lo, hi):
                x = model.block(x, p, layer, m, w.tp, self._rope)
            if last_stage:
                return model.head_loss(x, tgt.to(self.device), p, m, w.tp) * scale
            return x

        sched = OneFOneB(w.pp, (mb, m.seq_len, m.hidden_size), self.compute_dtype, self.device)
        losses = sched.run(forward, n_micro)
        faults.here("mid-step", self.step + 1)  # (the fault matrix's peer lost mid-step; unset: a no-op)

        # every collective of the step comes before its update: a peer that vanishes mid-step leaves
        # this rank's state at the last completed step (a heal starts from there)
        loss = torch.tensor([sum(losses)], dtype=torch.float64, device=self.device)
        w.dp.allreduce(loss)
        w.pp.allreduce(loss)
        grads = [p[s.name].grad for s in self.local_params]
        if lay.dp > 1:
            flat = torch._utils._flatten_dense_tensors(grads)
            w.dp.allreduce(flat)
            grads = torch._utils._unflatten_dense_tensors(flat, grads)
        faults.here("reduced", self.step + 1)
        grads = [g.float() for g in grads]
        norm = self._grad_norm(grads)
        clip = min(1.0, tr.grad_clip / (norm + 1e-6)) if tr.grad_clip > 0 else 1.0
        lr = learning_rate(tr, self.step)
        if self.mirror is not None:
            self.mirror.before_update()
        adamw_step([self.state[s.name] for s in self.local_params], grads,
                   [self.state[s.name + ".exp_avg"] for s in self.local_params],
                   [self.state[s.name + ".exp_avg_sq"] for s in self.local_params],
                   [len(s.shape) > 1 for s in self.local_params], tr, self.step, lr, clip)
        update = Update(step=self.step, lr=lr, grad_scale=clip)
        for s in self.local_params:
            p[s.name].grad = None
        self.refresh()

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.step += 1
        self.consumed_samples += tr.global_batch
        if self.mirror is not None:  # (the step is done: a mirror that fails leaves it whole)
            self.mirror.after_update({s.name: g for s, g in zip(self.local_params, grads)}, update)
        dt = time.perf_counter() - t0
        tokens = tr.global_batch * m.seq_len
        mfu = model_flops_utilisation(self._flops_per_token, tokens / dt, peak_flops(self.device, job.compute_dtype),
                                      lay.size)
        return StepStats(self.step, float(loss.item()), norm, lr, dt, tokens / dt, mfu)

    def _grad_norm(self, grads: list[torch.Tensor]) -> float:
        """Global L2 norm: TP-sharded parameters count on every TP rank, replicated ones once."""
        w = self.world
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for s, g in zip(self.local_params, grads):
            if s.shard_dim is not None or w.tp.rank == 0:
                total += g.double().pow(2).sum()
        w.tp.allreduce(total)
        w.pp.allreduce(total)
        return math.sqrt(float(total.item()))
