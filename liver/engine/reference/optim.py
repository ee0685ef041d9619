"""AdamW over fp32 master shards, and the learning-rate schedule (a pure function of the step)."""

from __future__ import annotations

import math

import torch

from liver.resource_view.spec import TensorSpec
from liver.topology.config import TrainConfig

OPTIMIZER_KINDS = ("exp_avg", "exp_avg_sq")


def with_adam_state(params: list[TensorSpec]) -> list[TensorSpec]:
    """Parameters followed by their AdamW moments, all fp32 (master state)."""
    out: list[TensorSpec] = []
    for p in params:
        out.append(p)
        for kind in OPTIMIZER_KINDS:
            out.append(TensorSpec(f"{p.name}.{kind}", p.shape, "float32", p.layer, p.shard_dim,
                                  kind=kind, param=p.name))
    return out


def learning_rate(t: TrainConfig, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at ``total_steps``."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.total_steps - t.warmup_steps)
    frac = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + math.cos(math.pi * frac))


@torch.no_grad()
def adamw_step(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avg: list[torch.Tensor],
               exp_avg_sq: list[torch.Tensor], decay: list[bool], t: TrainConfig, step: int,
               lr: float, grad_scale: float) -> None:
    """One decoupled-weight-decay Adam update, in place; ``step`` counts from 0."""
    if grad_scale != 1.0:
        grads = torch._foreach_mul(grads, grad_scale)
    n = step + 1
    bc1 = 1.0 - t.beta1 ** n
    bc2 = 1.0 - t.beta2 ** n
    torch._foreach_lerp_(exp_avg, grads, 1.0 - t.beta1)
    torch._foreach_mul_(exp_avg_sq, t.beta2)
    torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1.0 - t.beta2)
    decayed = [p for p, d in zip(params, decay) if d]
    if decayed and t.weight_decay:
        torch._foreach_mul_(decayed, 1.0 - lr * t.weight_decay)
    denom = torch._foreach_sqrt(exp_avg_sq)
    torch._foreach_div_(denom, math.sqrt(bc2))
    torch._foreach_add_(denom, t.eps)
    torch._foreach_addcdiv_(params, exp_avg, denom, value=-lr / bc1)



class AdamWReplay:
    """``adamw_step`` on the shards of the parameters given gradients and on their moments (a
    pre-copy's mirror: liver/runtime/mirror.py); decay as the engine decides it, by the
    parameter's logical shape."""

    def __init__(self, specs: dict[str, TensorSpec], t: TrainConfig) -> None:
        self.specs, self.t = specs, t

    def replayable(self, name: str) -> bool:
        return True

    def __call__(self, shards: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], update) -> None:
        names = list(grads)
        adamw_step([shards[n] for n in names], [grads[n] for n in names], [shards[n + ".exp_avg"] for n in names],
                   [shards[n + ".exp_avg_sq"] for n in names], [len(self.specs[n].shape) > 1 for n in names],
                   self.t, update.step, update.lr, update.grad_scale)
