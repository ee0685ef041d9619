"""Topology: model and parallel configuration, and the validated rank layout. Pure metadata."""

from liver.topology.config import JobConfig, ModelConfig, ParallelConfig, TrainConfig
from liver.topology.facts import ModelFacts
from liver.topology.layout import Coord, Layout, default_split

__all__ = ["Coord", "JobConfig", "Layout", "ModelConfig", "ModelFacts", "ParallelConfig", "TrainConfig",
           "default_split"]
