"""A user's model with persistent buffers (examples/llama.py's, each block with a running scale
and a call counter that a step reads and changes): LiveR moves them with the state, checkpoints
them, and digests them."""

from __future__ import annotations

import torch
from torch import nn

from llama_example import llama


class Decay(nn.Module):
    """x * scale, then scale decays by 0.99 (a running statistic, updated by the forward in
    training), and a count of the calls."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(dim))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def reset_running_stats(self) -> None:
        self.scale.fill_(1.0)
        self.calls.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * self.scale.clone()  # (the update below must not touch what autograd saved)
        if self.training:
            with torch.no_grad():
                self.scale.mul_(0.99)
                self.calls.add_(1)
        return out


class BufferedRecipe(llama.LlamaRecipe):
    name = "llama-buffered"

    def model(self, job):
        m = super().model(job)
        for block in m.layers.values():
            block.decay = Decay(job.model.hidden_size)
            inner = block.forward
            block.forward = (lambda f, d: (lambda x: d(f(x))))(inner, block.decay)
        return m


RECIPE = BufferedRecipe()
