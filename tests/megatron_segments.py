"""Test helper: one rank of a Megatron-Core GPT model over a LiveR World's gloo groups on CPU, run
on the session's worker pool (tests/conftest.py), against the same model built whole in the same
process."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist


def tp_step_matches_one_process(*, store_addr: str, namespace: str, rank: int, parallel: dict[str, Any],
                                config: dict[str, Any]) -> dict[str, float]:
    """The model at ``parallel`` (its TP degree over this World; one stage) and the model built whole
    on one-member groups, the whole one's values copied into this rank's boxes (the Resource View's
    ``Shard``s); one forward, backward and SGD step on one batch each. Returns the loss of each and
    the largest difference, over this rank's boxes, between the stepped weights."""
    warnings.filterwarnings("ignore")
    from liver.engine.megatron import cpu
    from liver.engine.megatron.config import GPTConfig
    from liver.engine.megatron.model import collection, gpt, world_collection
    from liver.engine.megatron.view import shards
    from liver.topology import ParallelConfig, TrainConfig
    from liver.topology.layout import Layout
    from liver.world.group import Group
    from liver.world.world import World, connect_store

    cpu.install("cpu")
    cfg = GPTConfig(**config)
    pc = ParallelConfig.from_dict(parallel)
    lay = Layout(cfg.num_layers, pc, TrainConfig(global_batch=2 * pc.dp, micro_batch=1))
    world = World.build(dist.PrefixStore(namespace + "/", connect_store(store_addr)), 0, lay, rank, "gloo",
                        torch.device("cpu"))
    world.connect()
    world.activate()
    solo = Group.solo(f"solo{rank}", [rank], "gloo", torch.device("cpu")).pg
    cpu.seed(1234, 0)
    whole = gpt(cfg, ParallelConfig(), [cfg.num_layers], 0, collection(solo, solo, solo, solo))
    cpu.seed(1234, world.coord.tp)
    model = gpt(cfg, pc, list(lay.layers_per_stage), world.coord.pp, world_collection(world))
    mine = shards(model, world.process_group("dp"), cfg.num_layers)
    ref = {s.name: s.data for s in shards(whole, solo, cfg.num_layers)}
    with torch.no_grad():
        for s in mine:  # (at one process every box is the whole tensor)
            s.data.copy_(ref[s.name][tuple(slice(lo, hi) for lo, hi in s.box)])
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length), generator=g)
    positions = torch.arange(cfg.seq_length).unsqueeze(0).expand(2, -1)
    losses = []
    for m in (whole, model):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        logits = m(tokens, positions, cpu.causal_mask(cfg.seq_length))
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), tokens.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        diff = max(float((s.data - ref[s.name][tuple(slice(lo, hi) for lo, hi in s.box)]).abs().max()) for s in mine)
        moved = max(float(s.data.abs().max()) for s in mine)
    world.deactivate()
    return {"whole_loss": losses[0], "loss": losses[1], "max_diff": diff, "max_abs": moved, "shards": len(mine)}
