"""``liver bench reconfig``: the same events applied live and by stop-and-restart, side by side in
one run, on the tiny model over CPU processes (gloo). For each scenario: downtime of each mode,
their ratio (restart with fresh interpreters, as torchrun starts processes; and "forked": the
restart given the agent's zygote too), the live prepare time, and the steady-state overhead of the live runs: the median,
over the steps of every repeat that ran while a Shadow World was prepared, of the step's time over
the median of the 20 steps of the same configuration just before the event, minus 1
("steady_overhead_generation": against all of the generation's other steps). The event comes after ``calm``
steps, so that each run has a baseline of that many steps. Beside it, the same estimate over steps
where nothing was prepared ("steady_overhead_placebo": the last steps before each window against
the 20 before them), and bootstrap 95% intervals over the events: on a shared 2-core machine step
times drift by several per cent over tens of steps, and the placebo shows what a run resolves.
The scenarios keep a core per process (``--world``), as a GPU run keeps a GPU per process."""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from liver.config.jobfile import build, read
from liver.policy.outcome import Outcome, outcome_of
from liver.bench.scenarios import back_and_forth
from liver.controller import report
from liver.controller.job import run_job
from liver.topology import ParallelConfig

SCENARIOS = {
    # world size -> (name, first configuration, event, the event back, steps between events with
    # --cycles: enough for the preparation, paced over 50-130 steps at the default share, and 20
    # steps of baseline); one process per core, as one per GPU.
    # The overhead is measured on the first configuration: tensor parallelism over gloo on a
    # CPU is a chain of socket round trips whose step time is mostly scheduling (tp2 on 2 cores:
    # 150 ms steps, windows of 3-4 steps varying by +-20%), so the 2-process scale-in and
    # reshape start from pp2 and still move half of the state.
    2: [("scale-out 1->2 (cold joiner)", "1,1,1", "scale-out 2 as 1,1,2", "scale-in 1 as 1,1,1", 200),
        ("scale-in 2->1 (deadline 60 s)", "1,2,1", "scale-in 1 deadline 60s as 1,1,1", "scale-out 2 as 1,2,1", 200),
        ("in-place reshape pp2->dp2", "1,2,1", "reshape 1,1,2", "reshape 1,2,1", 200)],
    4: [("scale-out 2->4 (cold joiners)", "1,2,1", "scale-out 4 as 2,1,2", "scale-in 2 as 1,2,1", 200),
        ("scale-in 4->2 (deadline 60 s)", "2,2,1", "scale-in 2 deadline 60s as 1,2,1", "scale-out 4 as 2,2,1", 200),
        ("in-place reshape tp2pp2dp1->tp1pp2dp2", "2,2,1", "reshape 1,2,2", "reshape 2,2,1", 200)],
}


FLAT_SCENARIOS = {
    # the same, for an engine without pipeline stages (a recipe's model: TP and FSDP only)
    2: [("scale-out 1->2 (cold joiner)", "1,1,1", "scale-out 2 as 1,1,2", "scale-in 1 as 1,1,1", 200),
        ("scale-in 2->1 (deadline 60 s)", "1,1,2", "scale-in 1 deadline 60s as 1,1,1", "scale-out 2 as 1,1,2", 200),
        ("in-place reshape tp2->dp2", "2,1,1", "reshape 1,1,2", "reshape 2,1,1", 200)],
    4: [("scale-out 2->4 (cold joiners)", "1,1,2", "scale-out 4 as 2,1,2", "scale-in 2 as 1,1,2", 200),
        ("scale-in 4->2 (deadline 60 s)", "2,1,2", "scale-in 2 deadline 60s as 1,1,2", "scale-out 4 as 2,1,2", 200),
        ("in-place reshape tp2dp2->dp4", "2,1,2", "reshape 1,1,4", "reshape 2,1,2", 200)],
}


def workload(path: str | None) -> tuple[dict[str, Any], dict[int, list]]:
    """The job file's engine, job and preparation settings (its events, layout and run settings
    are the benchmark's), and the scenario set its engine allows; None: the reference engine's
    tiny job."""
    if path is None:
        return {"preset": "tiny"}, SCENARIOS
    try:
        data = read(path)
    except ValueError as e:  # (the job file's reader names --config)
        raise ValueError(str(e).replace("--config", "--workload", 1)) from None
    base = {k: data[k] for k in ("engine", "preset", "job", "prepare") if k in data}
    cfg = build(base)
    adapter, job = cfg.adapter, cfg.job
    try:
        adapter.layout(job, ParallelConfig(pp=2))
        return base, SCENARIOS
    except ValueError:
        return base, FLAT_SCENARIOS


def default_world() -> int:
    """The largest scenario set with a core per process (2 on the 2-core CI machine)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(w for w in SCENARIOS if w <= max(cores, min(SCENARIOS)))


def _once(name: str, first: str, action: str, mode: str, steps: int, calm: int, run_dir: Path,
          back: str = "", gap: int = 0, cycles: int = 1, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run; with ``cycles`` > 1 the event, then the event back, and so on, ``gap`` steps apart:
    the scenario's figures are taken over each of its events (never over the events back)."""
    sc = back_and_forth(name, first, action, back, calm, gap, cycles)
    events = sc.parsed()
    # as many slots as its largest world: a core each, where the machine has them (liver/host/cores.py)
    cfg = build(base or {"preset": "tiny"}, {"steps": sc.step_budget(steps), "gpus": sc.gpus,
                 "parallel": first, "agent": {"slots": sc.slots, "quiet": True}, "checkpoint": {"every": 0},
                 "controller": {"mode": mode, "endpoint": False, "end_after_events": steps}})
    rep = run_job(cfg, events, run_dir, {"scenario": name})
    for e in rep["events"]:
        if outcome_of(e) is not Outcome.DONE or "downtime_s" not in e:
            raise RuntimeError(f"{name} ({mode}): event {e['status']}; see {run_dir}")
    mine = rep["events"][0::2]
    med = lambda k: statistics.median(e[k] for e in mine) if all(e.get(k) is not None for e in mine) else None  # noqa: E731
    # per event (one window each, each in its own generation): the unit the intervals resample
    pooled = report.pooled_overhead(rep["steps"], mine)
    windows = pooled["windows"]
    ratios = [q for w in windows for q in w]
    return {"downtime_s": med("downtime_s"), "prepare_s": med("prepare_s"), "prepare_cpu_s": med("prepare_cpu_s"),
            "joiner_cpu_s": med("joiner_cpu_s"), "steady_overhead": pooled["steady_overhead"],
            "bytes_moved": mine[0].get("bytes_moved"), "events": len(mine),
            "preparing_ratios": ratios, "windows": windows, "placebo_windows": pooled["placebo_windows"],
            "preparing_ratios_generation": report.preparing_ratios(rep["steps"], mine, None)[0],
            "transfer_s": med("transfer_s"), "run_dir": str(run_dir),
            # each event's own (the scenario's, and the events back: another change), to pool over runs
            "downtimes_s": [e["downtime_s"] for e in mine], "downtimes_back_s": [e["downtime_s"] for e in rep["events"][1::2]],
            "first_step_extras_s": [e["first_step_extra_s"] for e in mine]}


def run(repeats: int = 1, steps: int = 20, run_dir: Path | None = None, calm: int = 60,
        world: int | None = None, cycles: int = 1, workload_file: str | None = None) -> list[dict[str, Any]]:
    """The event comes after step ``calm``; each run ends ``steps`` steps after it was handled.
    ``world``: the scenario set (the largest number of processes; default ``default_world()``).
    ``workload_file``: a job file whose engine and job are benchmarked (default: the reference
    engine's tiny job)."""
    base, scenarios = workload(workload_file)
    world = default_world() if world is None else world
    if world not in SCENARIOS:
        raise ValueError(f"--world={world}: allowed {' or '.join(map(str, SCENARIOS))} (processes)")
    if calm < 3:
        raise ValueError(f"--calm-steps={calm}: allowed 3 or more (steps before the event)")
    if repeats < 1:
        raise ValueError(f"--repeats={repeats}: allowed a positive count")
    if steps < 3:
        raise ValueError(f"--steps={steps}: allowed 3 or more (steps after the event)")
    if cycles < 1:
        raise ValueError(f"--cycles={cycles}: allowed a positive count (the scenario's events per live run)")
    out = run_dir or Path(tempfile.mkdtemp(prefix="liver-bench-reconfig-"))
    rows = []
    for i, (name, first, action, back, gap) in enumerate(scenarios[world]):
        live, restart, forked = [], [], []
        for r in range(repeats):  # interleaved, so every mode sees the same machine state
            live.append(_once(name, first, action, "live", steps, calm, out / f"s{i}-live-{r}", back, gap, cycles,
                              base))
            restart.append(_once(name, first, action, "restart", steps, calm, out / f"s{i}-restart-{r}", base=base))
            forked.append(_once(name, first, action, "restart-forked", steps, calm, out / f"s{i}-forked-{r}",
                                base=base))
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        dl, dr, df = med(live, "downtime_s"), med(restart, "downtime_s"), med(forked, "downtime_s")
        ratios = [q for x in live for q in x["preparing_ratios"]]  # every repeat's preparing steps
        whole = [q for x in live for q in x["preparing_ratios_generation"]]
        placebo_windows = [w for x in live for w in x["placebo_windows"]]
        placebo = [q for w in placebo_windows for q in w]
        rows.append({"scenario": name, "workload": workload_file or "reference tiny", "event": action, "first": first, "steps_after_event": steps, "repeats": repeats,
                     "companion_share": build(base).prepare.companion_share,
                     "downtime_live_s": dl, "downtime_restart_s": dr, "ratio": dr / dl if dl > 0 else None,
                     # the baseline given the agent's zygote too (no interpreter boot, no imports)
                     "downtime_restart_forked_s": df, "ratio_forked": df / dl if dl > 0 else None,
                     "prepare_s": med(live, "prepare_s"), "prepare_cpu_s": med(live, "prepare_cpu_s"),
                     "joiner_cpu_s": med(live, "joiner_cpu_s"),
                     "steady_overhead": statistics.median(ratios) - 1 if ratios else None,
                     "steady_overhead_generation": statistics.median(whole) - 1 if whole else None,
                     "steady_overhead_ci95": report.median_ci95([w for x in live for w in x["windows"]]),
                     # the same estimate over steps with nothing prepared: what the machine resolves
                     "steady_overhead_placebo": statistics.median(placebo) - 1 if placebo else None,
                     "steady_overhead_placebo_ci95": report.median_ci95(placebo_windows), "steps_placebo": len(placebo),
                     "steps_preparing": len(ratios), "steps_before_event": calm, "world": world,
                     "cycles": cycles, "live_events": sum(x["events"] for x in live),
                     "steady_overhead_per_repeat": [x["steady_overhead"] for x in live],
                     "bytes_moved": live[0]["bytes_moved"], "transfer_s": med(live, "transfer_s"),
                     "downtime_live_all_s": [d for x in live for d in x["downtimes_s"]],
                     "downtime_live_back_all_s": [d for x in live for d in x["downtimes_back_s"]],
                     "first_step_extra_live_all_s": [d for x in live for d in x["first_step_extras_s"]],
                     "run_dirs": [x["run_dir"] for x in live + restart + forked]})
    return rows
