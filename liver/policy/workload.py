"""A job as its engine trains it: what the cost model (``costs``) and the target choice (``target``)
price. They read the model through its engine (``EngineAdapter.facts``: parameters, layers, width,
tokens a sample, FLOPs a token; ``state_specs``: its tensors), never through its configuration's
fields, so a model of any configuration (a recipe's own) is priced alike."""

from __future__ import annotations

from dataclasses import dataclass

from liver.engine.interface import EngineAdapter
from liver.resource_view.spec import TensorSpec
from liver.topology import JobConfig, Layout, ModelFacts, ParallelConfig, TrainConfig


@dataclass(frozen=True)
class Workload:
    adapter: EngineAdapter
    job: JobConfig

    @classmethod
    def reference(cls, job: JobConfig) -> "Workload":
        """A job of the reference engine (the simulator's presets, measured runs of its shapes)."""
        from liver.engine.reference import ADAPTER
        return cls(ADAPTER, job)

    @property
    def facts(self) -> ModelFacts:
        return self.adapter.facts(self.job)

    @property
    def train(self) -> TrainConfig:
        return self.job.train

    def layout(self, par: ParallelConfig) -> Layout:
        """``par`` over the model's layers (unchecked against the engine's shapes: the cost model
        prices any configuration; ``target`` asks the engine which it accepts)."""
        return Layout(self.facts.layers, par, self.job.train, par.world_size)

    def specs(self) -> list[TensorSpec]:
        return self.adapter.state_specs(self.job)
