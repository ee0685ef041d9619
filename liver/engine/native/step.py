"""One iteration of a recipe's own loop (``Recipe.loop``): what the loop body gets from LiveR.

    for step in steps:
        with step:
            loss = criterion(step.model(step.inputs), step.targets)   # or step.schedule_step()
            loss.backward()
            norm = step.clip_grad_norm(max_norm)
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
            step.done(loss, norm)

``model`` and ``optimizer`` are this generation's: after a switch the next step carries the new
mesh's, so the body must not keep them (or any tensor of theirs) from one iteration to the next.
"""

from __future__ import annotations

import time

import torch

from liver.engine.loop import LoopError, Step


class NativeStep(Step):
    """A step of a ``NativeEngine``: its model, optimizer, this rank's batch, and the helpers
    whose work spans ranks LiveR owns (the pipeline's schedule, the norm over every stage)."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self._t0 = time.perf_counter()
        self.job = engine.job
        self.model, self.optimizer = engine.model, engine.optimizer
        self.mesh = engine.world.mesh()
        """This generation's DeviceMesh (dimensions "pp", "dp", "tp"), for the loop's own collectives
        (a replicated model's gradient average over ``mesh["dp"]``)."""
        self.pipelined = engine.layout.pp > 1
        """Whether this generation has pipeline stages: then ``schedule_step`` runs forward and
        backward (each stage holds only its part of the model)."""
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def inputs(self) -> torch.Tensor:
        """This rank's inputs for the step (its data-parallel part of the global batch)."""
        return self._data()[0]

    @property
    def targets(self) -> torch.Tensor:
        return self._data()[1]

    def _data(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._batch is None:
            self._batch = self.engine.batch()
        return self._batch

    def schedule_step(self) -> torch.Tensor:
        """Forward and backward through this generation's pipeline stages (GPipe, the recipe's
        ``criterion`` on the last stage); the mean loss (0 on the stages before the last)."""
        if not self.pipelined:
            raise LoopError("step.schedule_step(): this generation has no pipeline stages (parallel.pp=1); "
                            "run the model on step.inputs instead (if not step.pipelined)")
        return self.engine.schedule_step(self.inputs, self.targets)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The gradients' global norm (over every stage and shard; a 0-dim tensor, read when the
        step ends: no wait for the device here), the gradients clipped to ``max_norm``."""
        return self.engine.clip_grad_norm(max_norm)

    def done(self, loss: torch.Tensor, grad_norm: "torch.Tensor | float") -> None:
        """The optimizer has stepped: count the step and report its loss (this rank's)."""
        if self.stats is not None:
            raise LoopError(f"step {self.number}: step.done() called twice (or after step.run())")
        self.stats = self.engine.finish(loss.detach() if isinstance(loss, torch.Tensor) else loss, grad_norm, self._t0)
