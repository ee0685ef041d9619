"""Resource events and where they come from: a schedule file, a spot trace, or the control endpoint.

Schedule file (``--events FILE``), one event per line, ``#`` starts a comment::

    at step 4: scale-out 4                 # 4 GPUs in total; the controller picks tp,pp,dp
    at step 12: reshape 1,2,2              # same GPUs, tp=1 pp=2 dp=2
    at 20s: scale-in 2 deadline 30s        # preemption notice: 2 GPUs left, 30 s to leave
    at step 30: scale-out 4 as 2,1,2:2/2   # naming the configuration (uneven PP as l0/l1/...)

A trigger is ``step N`` (after step N finished), ``step +N`` (N steps after the event before it in
the file ended: events one after another, whatever their handoffs take) or ``Ts`` (seconds since
the first step).
Everything is checked before training starts; an error names the file, the line and the problem.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from liver.topology import ParallelConfig



class EventKind(enum.StrEnum):
    """What an event asks for. A value, compared by identity; its text (``str``) is what a
    schedule says and a report records."""

    SCALE_OUT = "scale-out"   # more GPUs in total
    SCALE_IN = "scale-in"     # fewer (with a deadline: a preemption notice)
    RESHAPE = "reshape"       # the same GPUs, another configuration
    START = "start"           # a trace's first count: the job's GPUs at its start (not handled as an event)


KINDS = (EventKind.SCALE_OUT, EventKind.SCALE_IN, EventKind.RESHAPE)  # what a schedule line may ask for


@dataclass(frozen=True, kw_only=True, slots=True)
class EventsConfig:
    """Where a job's events come from: a ``schedule`` file, or a spot ``trace`` (its time divided
    by ``compress``; a removal announced ``notice_s`` of trace time before it); neither: the
    embedded schedule. Either way the control endpoint takes more while the job runs."""

    schedule: str | None = None
    trace: str | None = None
    compress: float = 600.0
    notice_s: float = 120.0

    def __post_init__(self) -> None:
        if self.schedule is not None and self.trace is not None:
            raise ValueError(f"events.schedule={self.schedule!r} and events.trace={self.trace!r}: "
                             "allowed one source of events")
        if not 0 < self.compress <= 1e9:
            raise ValueError(f"events.compress={self.compress!r}: allowed a positive factor")
        if not 0 <= self.notice_s <= 1e7:
            raise ValueError(f"events.notice_s={self.notice_s!r}: allowed 0 or more seconds")


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One event, as it was asked for and as far as the controller has placed it in time. Frozen:
    what the controller learns of it later (its trigger's time, the GPUs a node's notice leaves)
    makes a new value (``dataclasses.replace``) where it is kept."""

    kind: EventKind
    gpus: int | None = None                # total GPUs after the event
    parallel: ParallelConfig | None = None  # the requested configuration, if named
    at_step: int | None = None
    at_time: float | None = None
    deadline_s: float | None = None        # scale-in: seconds from the notice until the GPUs go
    source: str = ""                       # file:line, "http", ...
    arrived: float | None = None           # wall time it reached the job (control endpoint)
    node: str | None = None                # scale-in: the node whose ranks leave (its notice)
    after_previous: int | None = None      # ``step +N``: N steps after the event before it ended
                                           # (``at_step`` is set then)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))

    def describe(self) -> str:
        what = str(self.kind) + (f" {self.gpus}" if self.gpus is not None and self.kind is not EventKind.RESHAPE else "")
        if self.parallel is not None:
            what += f" as {self.parallel.short()}"
        if self.deadline_s is not None:
            what += f" deadline {self.deadline_s:g}s"
        return what

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "gpus": self.gpus,
                "parallel": self.parallel.short() if self.parallel else None,
                "at_step": self.at_step, "at_time": self.at_time, "deadline_s": self.deadline_s,
                "source": self.source, **({"node": self.node} if self.node else {}),
                **({"after_previous": self.after_previous} if self.after_previous is not None else {})}


class EventError(ValueError):
    pass


_LINE = re.compile(r"^at\s+(?:step\s+(?P<rel>\+)?(?P<step>\d{1,15})|(?P<time>\d{1,12}(?:\.\d{1,9})?)s)\s*:\s*"
                   r"(?P<action>.+)$")


def parse_action(text: str, where: str) -> Event:
    """``scale-out N [as P]``, ``scale-in N [deadline Ds] [as P]`` (N = 0: every GPU goes; the job
    waits with its state on disk for a later scale-out), ``reshape P``."""
    words = text.split()
    if not words or words[0] not in KINDS:
        shown = (words[0] if words else text)[:40]
        raise EventError(f"{where}: action {shown!r}: allowed {', '.join(KINDS)}")
    kind, rest = EventKind(words[0]), words[1:]
    parallel: ParallelConfig | None = None
    deadline_s: float | None = None
    try:
        if kind is EventKind.RESHAPE:
            if len(rest) != 1:
                raise EventError(f"{where}: 'reshape' takes one configuration tp,pp,dp, got {' '.join(rest)!r}")
            parallel = ParallelConfig.parse(rest[0])
            return Event(kind=kind, gpus=parallel.world_size, parallel=parallel, source=where)
        least = 0 if kind is EventKind.SCALE_IN else 1  # (scale-in 0: every GPU goes; the job waits on disk)
        if not rest or not rest[0].isdigit() or len(rest[0]) > 6 or int(rest[0]) < least:
            got = rest[0] if rest else "nothing"
            raise EventError(f"{where}: {kind} needs the total GPU count after the event (an integer from {least} "
                             f"to 999999), got {got if len(got) <= 20 else got[:20] + '...'!r}")
        gpus = int(rest[0])
        i = 1
        while i < len(rest):
            key = rest[i]
            if i + 1 >= len(rest):
                raise EventError(f"{where}: {key!r} needs a value")
            val = rest[i + 1]
            if key == "as":
                parallel = ParallelConfig.parse(val)
                if parallel.world_size != gpus:
                    raise EventError(f"{where}: as {val}: tp*pp*dp={parallel.world_size} but the event "
                                     f"leaves {gpus} GPUs")
            elif key == "deadline" and kind is EventKind.SCALE_IN:
                m = re.fullmatch(r"(\d+(?:\.\d+)?)s", val)
                if not m or float(m.group(1)) <= 0:
                    raise EventError(f"{where}: deadline {val!r}: allowed a positive duration like 30s")
                deadline_s = float(m.group(1))
            else:
                allowed = "'as', 'deadline'" if kind is EventKind.SCALE_IN else "'as'"
                raise EventError(f"{where}: option {key!r} of {kind}: allowed {allowed}")
            i += 2
    except ValueError as e:
        if isinstance(e, EventError):
            raise
        raise EventError(f"{where}: {e}") from None
    return Event(kind=kind, gpus=gpus, parallel=parallel, deadline_s=deadline_s, source=where)


def skypilot_counts(path: str | Path, text: str) -> list[tuple[int, int]]:
    """SkyPilot's spot traces (github.com/skypilot-org/spot-traces, the "Can't Be Late" paper's; the
    SpotHedge paper's artifact, github.com/MaoZiming/spothedge_ae ``data/``, writes its traces alike):
    ``{"metadata": {"gap_seconds": G, ...}, "data": [n0, n1, ...]}``, the instances available at
    each tick of G seconds, as (time in ms, nodes up) where the count changes; EventError naming
    the file and the line (JSON that does not parse) or the field and value that is not allowed."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise EventError(f"{path}:{e.lineno}: not a SkyPilot trace ({e.msg}, column {e.colno})") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 < gap < float("inf"):
        raise EventError(f"{path}: metadata.gap_seconds={gap!r}: allowed a positive number of seconds "
                         f"(a SkyPilot trace: {{\"metadata\": {{\"gap_seconds\": G}}, \"data\": [...]}})")
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise EventError(f"{path}: data={str(data)[:40]}: allowed a non-empty list of instance counts")
    counts: list[tuple[int, int]] = []
    for i, v in enumerate(data):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v != int(v):
            raise EventError(f"{path}: data[{i}]={v!r}: allowed a count of instances (an integer, 0 or more)")
        if not counts or counts[-1][1] != int(v):
            counts.append((round(i * gap * 1000), int(v)))
    if max(c for _, c in counts) == 0:
        raise EventError(f"{path}: no instance is ever available")
    return counts


def read_text(path: str | Path, what: str) -> str:
    """A text file's content (UTF-8, or UTF-16 with its byte-order mark); EventError naming the
    file if it is missing or not text."""
    p = Path(path)
    if not p.is_file():
        raise EventError(f"{path}: no such {what} file")
    data = p.read_bytes()
    try:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise EventError(f"{path}: not a text {what} file (byte {e.start} is not UTF-8)") from None
    if "\x00" in text:
        raise EventError(f"{path}: not a text {what} file (it holds NUL characters)")
    return text


def parse_schedule(path: str | Path) -> list[Event]:
    return parse_schedule_text(read_text(path, "events"), str(path))


def parse_schedule_text(text: str, path: str) -> list[Event]:
    """A schedule's lines; ``path`` names it in errors."""
    events: list[Event] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        where = f"{path}:{n}"
        if not m:
            raise EventError(f"{where}: {line!r}: expected 'at step N: ACTION', 'at step +N: ACTION' or "
                             f"'at Ts: ACTION'")
        ev = parse_action(m.group("action"), where)
        if m.group("rel"):
            ev = replace(ev, after_previous=int(m.group("step")))
        elif m.group("step") is not None:
            ev = replace(ev, at_step=int(m.group("step")))
        else:
            ev = replace(ev, at_time=float(m.group("time")))
        events.append(ev)
    return events


def trace_counts(path: str | Path) -> list[tuple[int, int]]:
    """A spot trace's nodes up over time: (time in ms, nodes up) at each time a line changes it;
    EventError naming the file and line of a malformed one. Two formats: Bamboo's lines
    (``time_ms,add|remove,nodeNAME``), and SkyPilot's spot-traces JSON (``skypilot_counts``)."""
    text = read_text(path, "trace")
    if text.lstrip().startswith("{"):
        return skypilot_counts(path, text)
    up: set[str] = set()
    counts: list[tuple[int, int]] = []  # (time in ms, exact: no float rounding between lines, nodes up)
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        parts = line.split(",")
        where = f"{path}:{n}"
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in ("add", "remove") or not parts[2]:
            raise EventError(f"{where}: {line!r}: expected time_ms,add|remove,nodeNAME")
        t_ms, op, node = int(parts[0]), parts[1], parts[2]
        if counts and t_ms < counts[-1][0]:
            raise EventError(f"{where}: time {t_ms} ms goes backwards (the line before is at {counts[-1][0]} ms)")
        if op == "add":
            if node in up:
                raise EventError(f"{where}: {node} added twice")
            up.add(node)
        else:
            if node not in up:
                raise EventError(f"{where}: {node} removed but not up")
            up.remove(node)
        if counts and counts[-1][0] == t_ms:
            counts[-1] = (t_ms, len(up))
        else:
            counts.append((t_ms, len(up)))
    if not counts:
        raise EventError(f"{path}: empty trace")
    if max(c for _, c in counts) == 0:
        raise EventError(f"{path}: no node is ever up (every add is removed at the same instant)")
    return counts


def parse_trace(path: str | Path, *, slots: int, compress: float, notice_s: float = 120.0) -> list[Event]:
    """A spot trace (``time_ms,add|remove,nodeNAME``) as scale events over ``slots`` local GPUs.

    Time is divided by ``compress``. The node count is mapped proportionally onto the slots
    (peak of the trace -> all slots, at least one); an event is made only when the local count
    changes. A removal becomes a scale-in notice ``notice_s`` (compressed) before the node goes
    (later if the previous event is later: events keep their order); its deadline is the removal.
    """
    if not compress > 0 or compress == float("inf"):
        raise EventError(f"--compress={compress}: allowed a positive factor")
    if not notice_s >= 0 or notice_s == float("inf"):
        raise EventError(f"--notice={notice_s}: allowed a non-negative number of seconds")
    counts = trace_counts(path)
    peak = max(c for _, c in counts)
    # zero nodes is zero GPUs (the job waits with its state on disk), except at the start
    local = [(t / 1000 / compress, max(1 if i == 0 else 0, min(slots, math.ceil(c * slots / peak))))
             for i, (t, c) in enumerate(counts)]
    events, current = [], local[0][1]
    for t, c in local[1:]:
        if c == current:
            continue
        if c > current:
            events.append(Event(kind=EventKind.SCALE_OUT, gpus=c, at_time=t, source=f"{path}@{t * compress:.0f}s"))
        else:  # the notice comes notice_s before the node goes, but not before the previous event
            at = max(t - notice_s / compress, events[-1].at_time if events else 0.0)
            events.append(Event(kind=EventKind.SCALE_IN, gpus=c, at_time=at, deadline_s=t - at,
                                source=f"{path}@{t * compress:.0f}s"))
        current = c
    return [Event(kind=EventKind.START, gpus=local[0][1], at_time=0.0, source=f"{path}:start")] + events
