"""A model of a configuration of its own, nothing Llama-shaped: a small residual MLP language model
whose ``[job.model]`` table has ``depth``, ``width``, ``context`` and ``vocab`` (``MLPConfig``),
tensor-parallel in its blocks' two projections, FSDP2 over its blocks, cut into pipeline stages by
block. Its facts (``Recipe.facts``) say its width, tokens a sample and FLOPs a token (no attention);
its parameters and blocks LiveR counts on the model itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from liver.data import batch
from liver.engine.native import Recipe
from liver.topology import ModelFacts


@dataclass(frozen=True, kw_only=True)
class MLPConfig:
    depth: int = 3
    width: int = 16
    context: int = 8
    vocab: int = 64

    def __post_init__(self) -> None:
        for name in ("depth", "width", "context", "vocab"):
            v = getattr(self, name)
            if v < 1:
                raise ValueError(f"model.{name}={v}: must be a positive integer")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MLPLM(nn.Module):
    def __init__(self, c: MLPConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.width)
        self.layers = nn.ModuleDict({str(i): Block(c.width) for i in range(c.depth)})
        self.head = nn.Linear(c.width, c.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x) if self.embed is not None else x
        for block in self.layers.values():
            x = block(x)
        return self.head(x) if self.head is not None else x


class MLPRecipe(Recipe):
    name = "mlp"
    config = MLPConfig

    def model(self, job):
        return MLPLM(job.model)

    def parallelize(self, model, mesh, job):
        if mesh["tp"].size() > 1:
            for block in model.layers.values():
                parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(input_layouts=Replicate()),
                                                       "down": RowwiseParallel(output_layouts=Replicate())})
        if mesh["dp"].size() > 1:
            for block in model.layers.values():
                fully_shard(block, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
        return model

    def check(self, job, parallel):
        if (2 * job.model.width) % parallel.tp:
            raise ValueError(f"parallel.tp={parallel.tp} does not divide 2 x model.width={2 * job.model.width}")

    def stage(self, model, layers, first, last):
        for i in [k for k in model.layers if int(k) not in layers]:
            del model.layers[i]
        model.embed = model.embed if first else None
        model.head = model.head if last else None
        return model

    def facts(self, job, params, layers):
        """No attention: 6 FLOPs a token for each parameter of a matrix multiply (the embedding's
        lookup is none), forward and backward."""
        m = job.model
        return ModelFacts(params=params, layers=layers, width=m.width, seq_len=m.context,
                          flops_per_token=6.0 * (params - m.vocab * m.width))

    def optimizer(self, model, job):
        return torch.optim.AdamW(model.parameters(), lr=job.train.lr, foreach=False)

    def batch(self, job, dp_rank, dp_size, position):
        return batch(job, dp_rank, dp_size, position, seq_len=job.model.context, vocab=job.model.vocab)

    def criterion(self, outputs, targets):
        return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten())


RECIPE = MLPRecipe()
