"""The training loop as LiveR hands it out: ``Steps``, an iterator of ``Step``s, one per iteration.

A worker's loop is ``adapter.drive(Steps(member))``: by default ``for step in steps: with step:
step.run()`` (the engine's own step), and a recipe's own loop (``Recipe.loop``) writes the body of
the iteration itself. Between two iterations the iterator takes the boundary: the step's record,
the consistent cut, and a switch where one is due. So the loop is the user's, and the
generations, meshes, cut and switch are LiveR's; after a switch the next ``Step`` carries the
new generation's engine.

A ``Step`` is a context manager: a collective that fails because a peer vanished (a killed
process, a lost node) is caught at the end of the ``with`` block, and the iterator stalls and
waits to be healed (``Member.stall``), then runs the iteration again on the healed generation.
This holds because an iteration changes the state only after its last collective (the optimizer
steps after the gradients' reductions and the norm's). Outside a ``with`` such an error ends the
process, and the controller recovers from the last checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol

from liver.world.broken import broken_group

if TYPE_CHECKING:
    from liver.engine.interface import StepStats, TrainingEngine


class Driver(Protocol):
    """What ``Steps`` needs of the process that trains (``liver.runtime.member.Member``)."""

    engine: "TrainingEngine | None"
    total_steps: int

    def after_step(self, stats: "StepStats") -> None:
        """The step's record, then the boundary (may switch ``engine``, or set it to None)."""

    def can_stall(self) -> bool:
        """Whether a broken collective now is a stall to be healed (not in a switch, peers exist)."""

    def stall(self, err: BaseException) -> None:
        """Wait to be healed; returns on the healed generation's engine, else raises ``err``."""


class LoopError(RuntimeError):
    """A loop body that broke LiveR's protocol (a programming error of the recipe)."""


class Step:
    """One iteration on this generation's engine (see the module's docstring)."""

    def __init__(self, engine: "TrainingEngine") -> None:
        self.engine = engine
        self.number = engine.step + 1
        self.stats: "StepStats | None" = None
        self.error: BaseException | None = None

    def run(self) -> "StepStats":
        """The engine's whole step (forward, backward, clipping, optimizer step)."""
        self.stats = self.engine.train_step()
        return self.stats

    def __enter__(self) -> "Step":
        return self

    def __exit__(self, kind, err, tb) -> bool:
        if isinstance(err, RuntimeError) and broken_group(err):
            self.error = err
            return True  # the iterator stalls on it
        return False


class Steps:
    """The iterations of a worker's training, across generations, until the job's last step."""

    def __init__(self, driver: Driver, make_step=Step) -> None:
        self.driver, self.make_step = driver, make_step

    def run_all(self) -> None:
        """LiveR's own loop: the engine's whole step, once an iteration."""
        for step in self:
            with step:
                step.run()

    def __iter__(self) -> Iterator[Step]:
        d, cleared = self.driver, None
        while d.engine is not None and d.engine.step < d.total_steps:
            if d.engine is not cleared:  # (a new generation's engine, or the loop's first)
                # from no gradient, as the restart's step would: an attempt that a lost peer aborted
                # leaves its partial gradients on tensors the healed generation may adopt
                d.engine.drop_grads()
            step = self.make_step(d.engine)
            yield step
            try:
                if step.error is not None:
                    raise step.error
                if step.stats is None:
                    raise LoopError(f"step {step.number}: the loop's iteration ended without step.run() or "
                                    f"step.done(loss, grad_norm), so no step was taken; call one of them once an "
                                    f"iteration, inside 'with step:'")
                d.engine.drop_grads()  # none is held across a boundary (a loop that zeroes them first)
                cleared = d.engine
                d.after_step(step.stats)
            except LoopError:
                raise
            except RuntimeError as err:
                if not broken_group(err) or not d.can_stall():
                    raise
                d.stall(err)  # then this iteration again, on the healed generation
