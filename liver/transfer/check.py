"""Reference contents for transfer checks: every element of a logical tensor gets a distinct,
layout-independent value, so a shard moved to the wrong place cannot compare equal."""

from __future__ import annotations

import dataclasses

import torch

from liver.engine.model import init_shard
from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box
from liver.topology.config import ModelConfig


def reference_shard(spec: TensorSpec, box: Box, model: ModelConfig, device: torch.device) -> torch.Tensor:
    tagged = dataclasses.replace(spec, name=spec.name + "#check")  # hashed even for norm weights
    return init_shard(tagged, box, model, seed=7, device=device)
