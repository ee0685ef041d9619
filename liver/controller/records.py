"""What the controller writes down about each event: the record of the report (plain data, as it
lands in report.json), and the aggregation of the workers' switch reports into it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from liver.config.fields import to_dict
from liver.policy.events import Event
from liver.policy.outcome import Outcome, outcome_of
from liver.protocol.messages import SwitchReport
from liver.topology import ParallelConfig


def least(reports, key: str) -> float:
    """A check's cost on the critical path: every rank runs it together (a collective), so the
    shortest time is the check itself; longer ones include waiting for the others to arrive."""
    return min((v for r in reports if (v := getattr(r, key)) is not None), default=0.0)


def first(reports, key: str):
    return next((v for r in reports if (v := getattr(r, key)) is not None), None)


def said(reports, key: str) -> str | None:
    """Every distinct text the ranks gave for ``key`` (a digest's error: the same on the ranks of
    one collective, another on the new generation's), in one line; None where none did."""
    texts = list(dict.fromkeys(part for r in reports if (v := getattr(r, key)) for part in v.split("; ")))
    return "; ".join(texts) or None


@dataclass(slots=True)
class EventRecord:
    """What became of one event, as the controller keeps it: the event in its report form
    (``event``), what happened to it (``outcome``, a value that every decision and reader
    compares), the sentence a person reads where it says more than the outcome's word (``says``),
    and what was measured and decided about it (``figures``, by the report's keys; read and written
    as the record's items). Plain data only at the report's boundary (``to_dict``); the journal
    keeps it whole."""

    event: dict[str, Any]
    outcome: Outcome = Outcome.STARTED
    says: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    _OWN = frozenset({"event", "outcome", "status"})

    @classmethod
    def of(cls, event: dict[str, Any], outcome: Outcome, says: str | None = None, **figures: Any) -> EventRecord:
        return cls(event, outcome, says, figures)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EventRecord:
        """A record in its report form (a journal written before records were typed)."""
        rest = {k: v for k, v in d.items() if k not in cls._OWN}
        out = outcome_of(d)
        return cls(dict(d.get("event", {})), out, d.get("status") if d.get("status") != out.value else None, rest)

    def settle(self, outcome: Outcome, says: str | None = None) -> EventRecord:
        """What became of it; ``says``: the sentence, where more than the outcome's word."""
        self.outcome, self.says = outcome, says
        return self

    @property
    def status(self) -> str:
        """The sentence a person reads (never matched: compare ``outcome``)."""
        return self.says if self.says is not None else self.outcome.value

    def to_dict(self) -> dict[str, Any]:
        """The report's form: the event, ``outcome`` as its value, ``status`` as its sentence, the figures."""
        return {"event": self.event, "outcome": self.outcome.value, "status": self.status, **self.figures}

    # the figures, as the record's items
    def __getitem__(self, key: str) -> Any:
        return self.figures[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self._OWN:
            raise KeyError(f"{key!r} is the record's own (settle() for the outcome)")
        self.figures[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.figures

    def get(self, key: str, default: Any = None) -> Any:
        return self.figures.get(key, default)

    def setdefault(self, key: str, default: Any) -> Any:
        return self.figures.setdefault(key, default)

    def update(self, *more: dict[str, Any], **figures: Any) -> None:
        for d in (*more, figures):
            for k, v in d.items():
                self[k] = v


@dataclass(slots=True)
class Handling:
    """The event the controller is handling: the event itself, its record for the report, and
    what only the controller needs while it handles it."""

    event: Event
    record: EventRecord
    cpu0: float = field(default_factory=time.thread_time)  # the controller thread's CPU at its start
    target: ParallelConfig | None = None
    leaving: list[int] = field(default_factory=list)   # processes that leave with it
    joiners: list[int] = field(default_factory=list)   # cold processes it started
    join_slots: list[int] = field(default_factory=list)
    forced: bool = False                                # its deadline forced the preparation
    choice: str | None = None  # why its target is not the fastest of its GPU count (``target.why``)

    @property
    def deadline_at(self) -> float | None:
        return self.record["deadline_at"]

    @property
    def attempt_started(self) -> float:
        return self.record["attempts"][-1]["t"] if self.record.get("attempts") else self.record["t_event"]


def new_record(ev: Event, arrived: float, old: ParallelConfig, new: ParallelConfig, old_generation: int,
               step: int) -> EventRecord:
    """``arrived``: when its trigger happened (a step's end, a trace time, a request's arrival):
    its deadline counts from there; ``t_event``: when the controller took it."""
    now = time.time()
    return EventRecord.of(ev.to_dict(), Outcome.STARTED, gpus=ev.gpus, arrived=arrived, t_triggered=arrived,
                          t_taken=now, taken_after_trigger_s=now - arrived,
                          deadline_at=arrived + ev.deadline_s if ev.deadline_s is not None else None,
                          old=old.short(), new=new.short(), old_generation=old_generation, t_event=now,
                          step_at_event=step)


def switch_metrics(done: dict[int, SwitchReport], leavers: dict[int, SwitchReport]) -> dict[str, Any]:
    """The event's figures from each process's switch report: ``done`` of the new generation's
    processes, ``leavers`` of the old ranks that left with it."""
    allrec = {**done, **leavers}
    # the pause is the old ranks' (a joiner's switch also counts its wait for them to arrive)
    olds = [r for r in allrec.values() if r.old_step is not None] or list(allrec.values())
    out: dict[str, Any] = {
        "switch_s": max(r.transfer["switch_s"] for r in olds),
        "transfer_s": max(r.transfer["seconds"] for r in allrec.values()),
        "peak_staging_bytes": max(r.transfer["peak_staging_bytes"] for r in allrec.values()),
        # shards that stayed in place (same process, same box), and those of them the new engine
        # did not adopt (copied into its own storage: FSDP2's buffers), summed over processes
        "bytes_kept": sum(r.transfer.get("bytes_kept", 0) for r in allrec.values()),
        "bytes_kept_copied": sum(r.transfer.get("bytes_kept_copied", 0) for r in allrec.values()),
        # what of the new engine Prepare made (``Prebuilt.path``), and the build left in the switch
        "build": " / ".join(sorted({r.transfer["build"] for r in done.values() if "build" in r.transfer})),
        "build_s": max((r.transfer["build_s"] for r in done.values() if "build_s" in r.transfer), default=0.0),
        "prebuild_s": max((r.prepare.prebuild_s for r in done.values()), default=0.0),
        "switch_start": min(r.switch_start for r in olds),
        "switch_end": max(r.switch_end for r in allrec.values()),
        "digest_after": first(done.values(), "digest_after"),
        "digest_after_s": least(done.values(), "digest_after_s"),
        "digest_before": first(allrec.values(), "digest_before"),
        "digest_before_s": least(allrec.values(), "digest_before_s"),
        "digest_error": said(allrec.values(), "digest_error"),
        "mock_warmup_s": max((r.prepare.mock_warmup_s for r in done.values()), default=0.0),
        "joiner_cpu_s": max((r.prepare.joiner_cpu_s for r in done.values()), default=0.0),
        "groups_s": max((r.prepare.groups_s for r in allrec.values()), default=0.0),
        # the preparation's own CPU time on the busiest training process (the companion thread's,
        # and the warm-up's where it ran at a boundary): what Prepare takes from the running steps
        "prepare_cpu_s": max((r.prepare.build_cpu_s + r.prepare.connect_cpu_s
                              for r in allrec.values() if r.old_step is not None), default=0.0),
        "prepare_by_proc": {p: to_dict(r.prepare) for p, r in allrec.items()},
        # communicators each process made for the new generation, and took over from the Active World
        "comms_created": {p: r.prepare.comms_created for p, r in allrec.items()},
        "comms_shared": {p: r.prepare.comms_shared for p, r in allrec.items()},
    }
    extra = [r.peak_extra_bytes for r in allrec.values() if r.peak_extra_bytes is not None]
    if extra:
        out["peak_extra_bytes"] = max(extra)
    mirrors = [r.precopy for r in allrec.values() if r.precopy is not None]
    if mirrors:
        out["precopy"] = precopy_metrics(mirrors, allrec.values())
    return out


def precopy_metrics(mirrors: list[dict[str, Any]], reports) -> dict[str, Any]:
    """A pre-copy's figures over the old ranks' mirrors (liver/runtime/mirror.py): whether the
    switch used them (a deadline may come first), the bytes copied before the switch and those the
    switch still moved, the gradients sent each mirrored step, the waits and replays it added to
    steps (the busiest process's), and the memory of the mirrors (the largest)."""
    steps = max(m["mirrored_steps"] for m in mirrors)
    return {"used": all(m["used"] for m in mirrors), "slices": mirrors[0]["slices"],
            "followers": sum(1 for m in mirrors if m.get("follower")),  # cold joiners that followed the steps
            "mirrored_steps": steps,
            "bytes_precopied": sum(m["bytes_precopied"] for m in mirrors),
            "bytes_streamed_at_switch": sum(r.transfer["bytes_sent"] + r.transfer["bytes_local"] for r in reports),
            "grad_bytes_per_step": sum(m["grad_bytes"] for m in mirrors) // 2 // max(1, steps),
            "copy_wait_s": max(m["copy_wait_s"] for m in mirrors),
            "replay_s": max(m["replay_s"] for m in mirrors),
            "mirror_bytes": max(m["mirror_bytes"] for m in mirrors),
            "capped_shards": mirrors[0]["capped_shards"]}
