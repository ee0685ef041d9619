"""examples/llama.py's model with its output head tied to its embedding, a tie that its tensor
parallelism breaks (the head becomes a weight of its own): the layouts hold different tensors."""

from __future__ import annotations

from torch import nn

from llama_example import llama


class TiedRecipe(llama.LlamaRecipe):
    name = "llama-tied"

    def model(self, job):
        m = super().model(job)
        m.output.weight = m.tok_embeddings.weight  # (vocab, dim) both
        return m

    def parallelize(self, model, mesh, job):
        if mesh["tp"].size() > 1:  # the tie does not survive the head's column split
            model.output.weight = nn.Parameter(model.output.weight.detach().clone())
        return super().parallelize(model, mesh, job)


RECIPE = TiedRecipe()
