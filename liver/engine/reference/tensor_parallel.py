"""Megatron-style tensor parallelism as autograd functions over a World's TP group.

Column-parallel linears shard the output dimension (input copied, gradient all-reduced);
row-parallel linears shard the input dimension (output all-reduced). Embedding and loss are
vocab-parallel. Every function takes the ``Group`` explicitly: nothing reads a global group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liver.world.group import Group


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        ctx.group.allreduce(grad)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        x = x.contiguous()
        group.allreduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceFromTP.apply(x, group)


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, vocab_lo: int,
                             group: Group) -> torch.Tensor:
    """Lookup in a vocabulary shard [vocab_lo, vocab_lo + rows); other ranks fill the rest."""
    if group.size == 1:
        return F.embedding(ids, weight)
    local = ids - vocab_lo
    outside = (local < 0) | (local >= weight.shape[0])
    out = F.embedding(local.masked_fill(outside, 0), weight)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tp(out, group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_lo: int, vocab_size: int,
                group: Group) -> torch.Tensor:
        logits = logits.float()
        n_local = logits.shape[-1]
        if vocab_lo + n_local > vocab_size:  # padded vocabulary entries never win
            logits = logits.clone()
            logits[:, max(0, vocab_size - vocab_lo):] = float("-inf")
        m = logits.max(dim=-1).values
        group.allreduce(m, "max")
        shifted = logits - m.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        group.allreduce(sum_exp)
        local_t = target - vocab_lo
        inside = (local_t >= 0) & (local_t < n_local)
        local_t = local_t.masked_fill(~inside, 0)
        picked = shifted.gather(1, local_t.unsqueeze(1)).squeeze(1).masked_fill(~inside, 0.0)
        group.allreduce(picked)
        loss = sum_exp.log() - picked
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_t, inside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, local_t, inside = ctx.saved_tensors
        grad = softmax
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_t] -= inside.to(grad.dtype)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_lo: int,
                                 vocab_size: int, group: Group) -> torch.Tensor:
    """Per-token loss from logits sharded over the vocabulary ([N, V/tp]) and targets [N]."""
    return _VocabParallelCrossEntropy.apply(logits, target, vocab_lo, vocab_size, group)
