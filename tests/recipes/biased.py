"""A model no test of the example names: examples/llama.py's blocks with LayerNorm (weight and bias)
instead of RMSNorm and biased feed-forward projections, its modules initialised by their own
``reset_parameters`` (Kaiming-uniform weights and biases, LayerNorm's ones and zeros); and one
recipe of it per optimizer (``SGD``: momentum, ``ADAGRAD``, ``NADAM``: a 0-dim ``mu_product``
besides ``step``, ``RMSPROP``: centred with momentum, three state tensors a parameter)."""

from __future__ import annotations

import torch
from torch import nn

from llama_example import llama


class FeedForward(llama.FeedForward):
    def __init__(self, dim: int, hidden: int) -> None:
        nn.Module.__init__(self)
        self.w1, self.w3, self.w2 = nn.Linear(dim, hidden), nn.Linear(dim, hidden), nn.Linear(hidden, dim)


class Block(llama.Block):
    def __init__(self, dim: int, heads: int, hidden: int, theta: float, eps: float) -> None:
        nn.Module.__init__(self)
        self.attention_norm, self.attention = nn.LayerNorm(dim, eps=eps), llama.Attention(dim, heads, theta)
        self.ffn_norm, self.feed_forward = nn.LayerNorm(dim, eps=eps), FeedForward(dim, hidden)


class Model(llama.Llama):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int, theta: float, eps: float) -> None:
        nn.Module.__init__(self)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim, heads, hidden, theta, eps) for i in range(layers)})
        self.norm, self.output = nn.LayerNorm(dim, eps=eps), nn.Linear(dim, vocab, bias=False)


class BiasedRecipe(llama.LlamaRecipe):
    name = "llama-biased"

    def model(self, job):
        m = job.model
        return Model(m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.ffn_size, m.rope_theta, m.norm_eps)


class WithOptimizer(BiasedRecipe):
    def __init__(self, name: str, make) -> None:
        self.name, self._make = name, make

    def optimizer(self, model, job):
        return self._make(model.parameters(), job.train)


SGD = WithOptimizer("biased-sgd", lambda ps, t: torch.optim.SGD(ps, lr=t.lr * 10, momentum=0.9))
ADAGRAD = WithOptimizer("biased-adagrad", lambda ps, t: torch.optim.Adagrad(ps, lr=t.lr * 10,
                                                                             initial_accumulator_value=0.1))
NADAM = WithOptimizer("biased-nadam", lambda ps, t: torch.optim.NAdam(ps, lr=t.lr, foreach=False))
RMSPROP = WithOptimizer("biased-rmsprop", lambda ps, t: torch.optim.RMSprop(ps, lr=t.lr, momentum=0.5, centered=True))
RECIPE = BiasedRecipe()
FUSED_ADAMW = WithOptimizer("biased-fused-adamw", lambda ps, t: torch.optim.AdamW(ps, lr=t.lr, weight_decay=0.1,
                                                                                  fused=True))
