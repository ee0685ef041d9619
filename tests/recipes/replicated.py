"""A user's model with data parallelism by replicas, DDP's way (examples/llama.py's model and TP,
every data-parallel rank holding the whole model, the loop averaging the gradients over
``step.mesh["dp"]``): a rank lost without notice is healed from its replicas."""

from __future__ import annotations

import torch
from torch import nn

from llama_example import llama


class _NoSharding:
    """A data-parallel axis of one rank, as the example's ``parallelize`` sees it: TP only."""

    def size(self) -> int:
        return 1


class ReplicatedLlamaRecipe(llama.LlamaRecipe):
    """Data parallelism by replicas, DDP's way: every data-parallel rank holds the whole (TP) model
    and the loop averages the gradients over mesh["dp"]. More memory than FSDP2, but a rank lost
    without notice is healed from its replicas, with no rollback to the checkpoint."""

    name = "llama-replicated"

    def parallelize(self, model, mesh, job):
        return llama.parallelize(model, {"tp": mesh["tp"], "dp": _NoSharding()}, job.compute_dtype == "bfloat16")

    def loop(self, steps):
        for step in steps:
            with step:
                if step.pipelined:
                    loss = step.schedule_step()
                else:
                    loss = self.criterion(step.model(step.inputs), step.targets)
                    loss.backward()
                average_gradients(step.model, step.mesh["dp"])
                norm = step.clip_grad_norm(step.job.train.grad_clip)
                step.optimizer.step()
                step.optimizer.zero_grad(set_to_none=True)
                step.done(loss, norm)


def average_gradients(model: nn.Module, dp) -> None:
    """The mean of each gradient over the data-parallel replicas (their local shards: a TP
    DTensor's replicas hold the same shard)."""
    if dp.size() == 1:
        return
    group = dp.get_group()
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad
            torch.distributed.all_reduce(g, group=group)
            g.div_(dp.size())


RECIPE = ReplicatedLlamaRecipe()
