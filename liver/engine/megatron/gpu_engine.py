"""One rank of a Megatron-Core GPT job on a GPU, trained as Megatron trains it: its DDP (the
gradients in its buffers, reduced by it), its distributed optimizer (fp32 main weights and Adam
moments in the optimizer's own shards, its update and its gradient clipping) and its own pipeline
schedule (``get_forward_backward_func``), all on the World's groups (``distopt.full_collection``).

What moves live is the same as ``engine.MegatronEngine``'s: every piece of the model's sharded
state, as a view of the optimizer's fp32 main weight, and the same views of its two moments. At
one DP rank the optimizer's shard of each parameter is the whole parameter, so those views are
boxes; over several DP ranks a shard is a flat range (``distopt``: boxes of it), which LiveR's
transfer does not move yet: the adapter refuses DP above one for this engine.

Megatron's optimizer and schedule make CUDA tensors (``torch.tensor(..., device="cuda")``): this
engine runs on a GPU only.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from liver.engine.interface import StepStats
from liver.engine.megatron.distopt import full_collection, wrap
from liver.engine.megatron.engine import MegatronEngine
from liver.engine.reference.optim import learning_rate
from liver.host import faults
from liver.resource_view.spec import TensorSpec
from liver.topology.config import JobConfig
from liver.world.world import World


def optimizer_config(job: Any) -> Any:
    """Megatron's ``OptimizerConfig`` from the job's training settings: AdamW (decoupled weight
    decay), its distributed form, bf16 or fp32 as the job computes, gradients clipped at the job's
    norm."""
    from megatron.core.optimizer import OptimizerConfig
    tr = job.train
    return OptimizerConfig(optimizer="adam", lr=tr.lr, min_lr=tr.min_lr, weight_decay=tr.weight_decay,
                           adam_beta1=tr.beta1, adam_beta2=tr.beta2, adam_eps=tr.eps, clip_grad=tr.grad_clip,
                           bf16=job.compute_dtype == "bfloat16", use_distributed_optimizer=True,
                           decoupled_weight_decay=True)


def one_optimizer(optimizer: Any) -> Any:
    """The distributed optimizer ``get_megatron_optimizer`` made, out of the chain it returns (one
    link: a dense model has no expert parameters)."""
    links = getattr(optimizer, "chained_optimizers", [optimizer])
    if len(links) != 1:
        raise ValueError(f"megatron: {len(links)} optimizers for one model (expert parameters?): allowed one")
    return links[0]


class MegatronGpuEngine(MegatronEngine):
    """A rank of a Megatron-Core GPT job with Megatron's DDP, distributed optimizer and schedule."""

    def __init__(self, job: JobConfig, world: World, device: torch.device, specs: list[TensorSpec],
                 flops_per_token: float, *, initialise: bool = True,
                 state: dict[str, torch.Tensor] | None = None) -> None:
        if torch.device(device).type != "cuda":
            raise ValueError(f"engine megatron-distributed-optimizer: device {device}: Megatron's distributed "
                             f"optimizer and schedule need a GPU; on a CPU use engine = "
                             f"'liver.engine.megatron:ADAPTER'")
        super().__init__(job, world, device, specs, flops_per_token, initialise=initialise, state=state)

    def _optimizer_state(self) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
        """Megatron's DDP around the model and its distributed optimizer over it; each parameter's
        main weight and moments are the optimizer's shard of it, whole at one DP rank (a view in
        the parameter's shape)."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import get_megatron_optimizer
        w = self.world
        self.pgs = full_collection(w.process_group("tp"), w.process_group("pp"), w.process_group("dp"),
                                   w.solo_process_group("megatron-cp"))
        with w.registered_here():  # (its parameter groups are agreed over the default group: this World's)
            self.ddp = wrap(self.model, self.pgs)
            self.optimizer = one_optimizer(get_megatron_optimizer(optimizer_config(self.job), [self.ddp],
                                                                  pg_collection=self.pgs, use_gloo_process_groups=False))
        config = self.model.config
        config.no_sync_func = self.ddp.no_sync
        config.grad_scale_func = self.optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
        inner = self.optimizer.optimizer
        main, moments = [], {"exp_avg": [], "exp_avg_sq": []}
        for p in self.params:
            held = self._main_shard(p)  # (the optimizer's parameter: in fp32 a view of the model's)
            shard = held.detach()  # (the state has no autograd)
            if shard.numel() != p.numel():
                raise ValueError(f"megatron-distributed-optimizer: a parameter of {p.numel()} elements has a shard "
                                 f"of {shard.numel()} on this rank: allowed parallel.dp=1")
            state = inner.state[held]  # (made now, as Megatron's own init_state_fn does, with torch's step count)
            for kind in moments:
                state.setdefault(kind, torch.zeros_like(shard, memory_format=torch.contiguous_format))
                moments[kind].append(state[kind].view(p.shape))
            state.setdefault("step", torch.tensor(0.0))
            main.append(shard.view(p.shape))
        return main, moments

    def _main_shard(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The optimizer's fp32 main weight of ``p`` (its shard of it)."""
        group, order = self.optimizer.model_param_group_index_map[p]
        return self.optimizer.optimizer.param_groups[group]["params"][order]

    # ---- what the runtime asks of an engine -------------------------------------------------
    def drop_grads(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        super().drop_grads()

    @torch.no_grad()
    def refresh(self) -> None:
        """The model's parameters from the optimizer's main weights, as its step leaves them."""
        self.optimizer._copy_main_params_to_model_params()
        self.ddp.start_param_sync(force_sync=True)

    def load_scalars(self, s: dict[str, Any]) -> None:
        super().load_scalars(s)
        for state in self.optimizer.optimizer.state.values():  # (torch's AdamW counts steps per tensor)
            state["step"] = torch.tensor(float(self.step))

    # ---- training ----------------------------------------------------------------------------
    def train_step(self) -> StepStats:
        from megatron.core.pipeline_parallel import get_forward_backward_func
        t0 = time.perf_counter()
        job, lay, w = self.job, self.layout, self.world
        cfg, tr = job.model, job.train
        c = lay.coord(w.rank)
        n_micro, mb = lay.num_micro_batches, tr.micro_batch
        first_sample = self.consumed_samples + c.dp * lay.local_batch
        lr = learning_rate(tr, self.step)
        for group in self.optimizer.param_groups:  # (what Megatron's scheduler sets each step)
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = tr.weight_decay * group.get("wd_mult", 1.0)
        self.drop_grads()
        store = get_forward_backward_func(pp_size=lay.pp)(
            forward_step_func=self._forward_step, data_iterator=self._micro_batches(first_sample, n_micro, mb),
            model=[self.ddp], num_microbatches=n_micro, seq_length=cfg.seq_length, micro_batch_size=mb,
            forward_only=False, **self._schedule_extra())
        faults.here("mid-step", self.step + 1)
        ok, norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("megatron: the optimizer skipped its step (a non-finite gradient)")
        faults.here("reduced", self.step + 1)
        loss = torch.tensor([sum(float(d["loss"]) for d in store) / (n_micro * lay.dp)], dtype=torch.float64,
                            device=self.device)
        w.dp.allreduce(loss)
        w.pp.allreduce(loss)
        return self._stepped(t0, float(loss.item()), float(norm), lr)

    def _schedule_extra(self) -> dict[str, Any]:
        """What Megatron's schedule takes beyond the batch: the groups, and between stages the
        point-to-point communicator over the World's PP group."""
        extra: dict[str, Any] = {"pg_collection": self.pgs}
        if self.layout.pp > 1:
            from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
            extra["p2p_communicator"] = P2PCommunicator(pp_group=self.pgs.pp, config=self.model.config)
        return extra

    def _micro_batches(self, first: int, n: int, mb: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self._micro_batch(first + i * mb) for i in range(n))

    def _forward_step(self, data: Iterator[tuple[torch.Tensor, torch.Tensor]], model: Any) -> tuple[Any, Any]:
        """Megatron's forward-step function: the model's output and the function of its loss (on
        the last stage; Megatron divides it by the micro-batches)."""
        ids, tgt = next(data)
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0).expand(ids.shape[0], -1)
        return model(ids, positions, self._mask), functools.partial(self._loss, tgt)

    def _loss(self, tgt: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = F.cross_entropy(out.float().reshape(-1, self.job.model.vocab_size), tgt.reshape(-1))
        return loss, {"loss": loss.detach().clone()}  # (a copy: the schedule divides the loss in place)
