"""Scenarios of the benchmarks: a first configuration and a sequence of events at given steps,
shared by the CPU bench (``liver bench reconfig``: one event and the event back, repeated) and the
GPU runs (``liver bench handoffs``)."""

from __future__ import annotations

from dataclasses import dataclass

from liver.policy.events import Event, parse_schedule_text
from liver.topology import ParallelConfig


#: steps a preparation may take beside training, for a run's step budget: each event comes its gap
#: after the one before it *ended* (measured: 50-170 paced steps at the default share on 2 cores)
PREPARING_STEPS = 500


@dataclass(frozen=True)
class Scenario:
    name: str
    first: str                             # tp,pp,dp at the start
    events: tuple[tuple[str, int], ...]    # (action, the step after which it comes)

    @property
    def gpus(self) -> int:
        return ParallelConfig.parse(self.first).world_size

    def parsed(self, at: list[int] | None = None) -> list[Event]:
        """The events one after another: the first at its step, each next one as many steps after
        the one before it ended as their steps differ (a notice never overtakes a handoff still in
        flight); or each at ``at`` (a restart run cut where a live run switched)."""
        return parse_schedule_text(self.schedule(at), f"scenario {self.name!r}")

    @property
    def slots(self) -> int:
        """As many as its largest world."""
        return max([self.gpus] + [e.gpus for e in self.parsed()])

    def step_budget(self, after: int) -> int:
        """Steps enough for every event and ``after`` steps beyond the last (a run ends there:
        ``end_after_events``): the last event's step, and ``PREPARING_STEPS`` for each event's
        preparation before it (the next one counts its gap from the end of the one before)."""
        return self.events[-1][1] + len(self.events) * PREPARING_STEPS + after

    def schedule(self, at: list[int] | None = None) -> str:
        if at is not None:
            return "".join(f"at step {s}: {a}\n" for (a, _), s in zip(self.events, at))
        steps = [s for _, s in self.events]
        return "".join(f"at step {s}: {a}\n" if i == 0 else f"at step +{s - steps[i - 1]}: {a}\n"
                       for i, (a, s) in enumerate(self.events))


def back_and_forth(name: str, first: str, action: str, back: str, calm: int, gap: int, cycles: int) -> Scenario:
    """``action`` after step ``calm``, then ``back``, and so on, ``gap`` steps apart, ``cycles``
    times ``action`` (the figures are taken over those, never over the events back)."""
    return Scenario(name, first, tuple((action if i % 2 == 0 else back, calm + i * gap) for i in range(2 * cycles - 1)))
