"""A Llama-style model in plain PyTorch, trained by LiveR and reshaped live (TP, FSDP, pipeline stages).

Run it:  liver run --config configs/llama-native.toml
The model knows nothing of LiveR. The recipe at the bottom builds and parallelises it (TorchTitan's
pattern: parallelize over a named DeviceMesh) and trains it in its own loop, one LiveR step a turn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               parallelize_module)

from liver.data import batch
from liver.engine.native import Recipe


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:  # (LiveR builds the model on the meta device, then runs this)
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of [batch, seq, heads, head_dim] (computed, not a buffer)."""
    seq, half = x.shape[1], x.shape[-1] // 2
    freqs = 1.0 / theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), freqs)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = dim // heads, theta
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape  # under TP each rank has its own heads: -1 is the local head count
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, self.theta), rope(k, self.theta)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, theta: float, eps: float) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(dim, eps), Attention(dim, heads, theta)
        self.ffn_norm, self.feed_forward = RMSNorm(dim, eps), FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int, theta: float = 1e4,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim, heads, hidden, theta, eps) for i in range(layers)})
        self.norm, self.output = RMSNorm(dim, eps), nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (a pipeline stage lacks what it does not run)
        x = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for block in self.layers.values():
            x = block(x)
        return self.output(self.norm(x)) if self.output is not None else x


def parallelize(model: Llama, mesh, bf16: bool) -> Llama:
    """Megatron-style TP over mesh["tp"], then FSDP2 over mesh["dp"] (per block, then the root);
    ``bf16``: FSDP2 computes in bfloat16 and reduces gradients in float32 (TorchTitan's default)."""
    tp, dp = mesh["tp"], mesh["dp"]
    if tp.size() > 1:
        parallelize_module(model, tp, {k: v for k, v in {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate())}.items() if getattr(model, k) is not None})
        for block in model.layers.values():
            parallelize_module(block, tp, {
                "attention": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)),
                **{f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")},
                "attention.wo": RowwiseParallel(output_layouts=Replicate()),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Replicate())})
    if dp.size() > 1:  # over TP's DTensors this makes 2-D shards (FSDP2's _StridedShard)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
        for block in model.layers.values():
            fully_shard(block, mesh=dp, mp_policy=mp)
        fully_shard(model, mesh=dp, mp_policy=mp)
    return model


class LlamaRecipe(Recipe):
    name = "llama"

    def model(self, job):
        m = job.model
        return Llama(m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.ffn_size, m.rope_theta, m.norm_eps)

    def parallelize(self, model, mesh, job):
        return parallelize(model, mesh, job.compute_dtype == "bfloat16")

    def stage(self, model, layers, first, last):
        """Pipeline stage: its blocks under their own names, the embedding first, the head last."""
        for i in [k for k in model.layers if int(k) not in layers]:
            del model.layers[i]
        model.tok_embeddings = model.tok_embeddings if first else None
        model.norm, model.output = (model.norm, model.output) if last else (None, None)
        return model

    def check(self, job, parallel):
        for field in ("num_heads", "ffn_size", "vocab_size"):
            if getattr(job.model, field) % parallel.tp:
                raise ValueError(f"parallel.tp={parallel.tp} does not divide model.{field}={getattr(job.model, field)}")

    def optimizer(self, model, job):
        t = job.train
        params = list(model.parameters())
        # fused on GPUs, as TorchTitan; CPU: torch's default. Tensor parallelism without FSDP2 leaves
        # the norms plain tensors beside DTensors, which one fused (or foreach) update cannot mix:
        # there, the update a parameter at a time
        mixed = 0 < sum(isinstance(p, DTensor) for p in params) < len(params)
        return torch.optim.AdamW(params, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay,
                                 fused=True if params[0].is_cuda and not mixed else None,
                                 foreach=False if mixed else None)

    def scheduler(self, optimizer, job):
        warmup = max(1, job.train.warmup_steps)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))

    def batch(self, job, dp_rank, dp_size, position):
        """Samples by global position from job.train.data (liver data prepare), the same for any layout."""
        return batch(job, dp_rank, dp_size, position)

    def loop(self, steps):
        """The training loop: LiveR hands out one step an iteration, on this generation's mesh."""
        for step in steps:
            with step:  # a peer lost mid-step: healed, and the iteration run again
                # bfloat16: autocast where FSDP2 does not cast (no data-parallel sharding)
                amp = step.job.compute_dtype == "bfloat16" and step.mesh["dp"].size() == 1
                with torch.autocast(step.inputs.device.type, torch.bfloat16, enabled=amp):
                    if step.pipelined:  # pipeline stages: LiveR's schedule runs forward and backward
                        loss = step.schedule_step()
                    else:
                        loss = self.criterion(step.model(step.inputs), step.targets)
                if not step.pipelined:
                    loss.backward()
                norm = step.clip_grad_norm(step.job.train.grad_clip)
                step.optimizer.step()
                step.optimizer.zero_grad(set_to_none=True)
                step.done(loss, norm)

    def criterion(self, logits, targets):
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


RECIPE = LlamaRecipe()
