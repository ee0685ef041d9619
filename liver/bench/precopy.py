"""``liver bench precopy``: the pause of one change with pre-copy and without, at the tiny model and at
models about 10x and 30x its size, side by side in one run (CPU processes over gloo, the reference
engine). Each live run repeats the change and its way back (``cycles`` times each); the runs
alternate between pre-copy on and off, size after size, so both see the same machine.

Per event: the pause (``downtime_s``: the last old step's end to the first new step's start,
minus a step), the switch's own time, the transfer in it, the bytes the switch still moved and
those pre-copied; per run, the steps that mirrored (the slices' copies and each step's gradients
and replayed update) against the 20 steps before the event (``mirror_overhead``: median ratio - 1)."""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from liver.bench.scenarios import back_and_forth
from liver.config.jobfile import build
from liver.controller.job import run_job
from liver.policy.outcome import Outcome, outcome_of
from liver.topology.presets import preset

# (name, hidden size, FFN size): the tiny model, then wider layers (4 layers, 4 heads each)
SIZES = {"tiny": (64, 128), "x10": (208, 416), "x30": (352, 704)}
# two processes: half the state or more moves between them
CHANGES = {"reshape": ("in-place reshape pp2->dp2", "1,2,1", "reshape 1,1,2", "reshape 1,2,1"),
           "scale-in": ("scale-in 2->1 (a notice)", "1,2,1", "scale-in 1 as 1,1,1", "scale-out 2 as 1,2,1"),
           # the joiner follows the old rank's steps: the stage it takes is mirrored to it
           "scale-out": ("scale-out 1->2 (a cold joiner)", "1,1,1", "scale-out 2 as 1,2,1", "scale-in 1 as 1,1,1")}


def model_of(size: str) -> dict[str, Any]:
    hidden, ffn = SIZES[size]
    return {"hidden_size": hidden, "ffn_size": ffn}


def parameters(size: str) -> int:
    job = preset("tiny")
    return replace(job, model=replace(job.model, **model_of(size))).model.facts().params


def _run(size: str, change: str, precopy: bool, cycles: int, gap: int, calm: int, run_dir: Path) -> dict[str, Any]:
    name, first, action, back = CHANGES[change]
    sc = back_and_forth(name, first, action, back, calm, gap, cycles)
    cfg = build({"preset": "tiny"}, {
        "steps": sc.step_budget(10), "gpus": sc.gpus, "parallel": first, "digest": "switch",
        "job": {"model": model_of(size)}, "agent": {"slots": sc.slots, "quiet": True},
        "checkpoint": {"every": 0}, "prepare": {"precopy": precopy, "companion_share": 0.0, "mock_steps": 0},
        "controller": {"mode": "live", "endpoint": False, "end_after_events": 10}})
    rep = run_job(cfg, sc.parsed(), run_dir, {"size": size, "precopy": precopy})
    step_s = {s["step"]: s["step_s"] for s in rep["steps"]}
    events = []
    for e in rep["events"][0::2]:  # the change's own events, not the way back
        if outcome_of(e) is not Outcome.DONE or "downtime_s" not in e:
            raise RuntimeError(f"{size} {change} precopy={precopy}: event {e['status']}; see {run_dir}")
        pc = e.get("precopy") or {}
        last = e["last_old_step"]
        base = [step_s[s] for s in range(e["step_at_event"] - 20, e["step_at_event"]) if s in step_s]
        mirrored = [step_s[s] for s in range(last - pc.get("mirrored_steps", 0) + 1, last + 1) if s in step_s]
        events.append({"downtime_s": e["downtime_s"], "pause_s": e["pause_s"], "switch_s": e["switch_s"],
                       "transfer_s": e["transfer_s"], "digest_equal": e["digest_equal"],
                       "bytes_moved": e["bytes_moved"],
                       "bytes_streamed_at_switch": pc.get("bytes_streamed_at_switch"),
                       "bytes_precopied": pc.get("bytes_precopied", 0), "precopy_used": pc.get("used", False),
                       "slices": pc.get("slices", 0), "mirrored_steps": pc.get("mirrored_steps", 0),
                       "grad_bytes_per_step": pc.get("grad_bytes_per_step", 0), "mirror_bytes": pc.get("mirror_bytes", 0),
                       "mirror_step_ratios": [m / statistics.median(base) for m in mirrored] if base else [],
                       # what mirroring added to the steps it ran beside, in seconds
                       "mirror_extra_s": sum(m - statistics.median(base) for m in mirrored) if base else None})
    return {"size": size, "change": change, "precopy": precopy, "run_dir": str(run_dir), "events": events}


def _interval(xs: list[float]) -> list[float]:
    """The middle 90% of the events' values (all of them under 10 events)."""
    s = sorted(xs)
    k = len(s) // 20
    return [s[k], s[-1 - k]]


def run(sizes: list[str], changes: list[str], cycles: int = 4, gap: int = 20, calm: int = 25,
        run_dir: Path | None = None) -> list[dict[str, Any]]:
    for s in sizes:
        if s not in SIZES:
            raise ValueError(f"--sizes: {s!r}: allowed {', '.join(SIZES)}")
    for c in changes:
        if c not in CHANGES:
            raise ValueError(f"--changes: {c!r}: allowed {', '.join(CHANGES)}")
    if cycles < 1:
        raise ValueError(f"--cycles={cycles}: allowed a positive count")
    if gap < 10:
        raise ValueError(f"--gap={gap}: allowed 10 or more steps between events (a pre-copy's slices and the "
                         "20-step baseline need them)")
    out = run_dir or Path(tempfile.mkdtemp(prefix="liver-bench-precopy-"))
    runs = []
    for change in changes:
        for size in sizes:
            for precopy in (False, True):  # alternating: both see the same machine
                runs.append(_run(size, change, precopy, cycles, gap, calm, out / f"{change}-{size}-{int(precopy)}"))
    rows = []
    for r in runs:
        ev = r["events"]
        ratios = [q for e in ev for q in e["mirror_step_ratios"]]
        down = [e["downtime_s"] for e in ev]
        rows.append({"change": CHANGES[r["change"]][0], "size": r["size"], "parameters": parameters(r["size"]),
                     "precopy": r["precopy"], "events": len(ev),
                     "downtime_median_s": statistics.median(down), "downtime_interval_s": _interval(down),
                     "downtime_all_s": down,
                     "switch_median_s": statistics.median(e["switch_s"] for e in ev),
                     "transfer_median_s": statistics.median(e["transfer_s"] for e in ev),
                     "bytes_moved": ev[0]["bytes_moved"],
                     "bytes_streamed_at_switch": ev[0]["bytes_streamed_at_switch"],
                     "bytes_precopied": ev[0]["bytes_precopied"], "precopy_used": all(e["precopy_used"] for e in ev),
                     "slices": ev[0]["slices"], "mirrored_steps_median": statistics.median(e["mirrored_steps"] for e in ev),
                     "grad_bytes_per_step": ev[0]["grad_bytes_per_step"], "mirror_bytes": ev[0]["mirror_bytes"],
                     "mirror_overhead": statistics.median(ratios) - 1 if ratios else None,
                     "mirror_steps_measured": len(ratios),
                     "mirror_extra_median_s": statistics.median(e["mirror_extra_s"] for e in ev)
                     if all(e["mirror_extra_s"] is not None for e in ev) else None,
                     "digest_equal": all(e["digest_equal"] for e in ev), "run_dir": r["run_dir"]})
    return rows
