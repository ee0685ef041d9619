"""The run's report: per step (time, loss, configuration, generation, digest), per event (phases,
downtime, bytes moved), a summary table and a PNG timeline. Definitions as in DESIGN.md:

- downtime: from the end of the last step on the old generation to the end of the first step on the
  new one, minus one normal step (median step time of the new generation, its first step left out;
  the old generation's when the new one ran a single step); the state digests taken
  for checking (``--digest``) inside that window are measured and left out. Computed as the pause
  between the two steps plus the first new step's excess over a normal step when positive (step
  time noise alone does not make it negative).
- steady-state overhead: median step time while a Shadow World is prepared / median without - 1,
  "without" being the steps of the same configuration just before (see ``preparing_ratios``).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

from liver.policy.outcome import SETTLED, WITHOUT_CHECKPOINT, outcome_of


def read_steps(run_dir: Path) -> list[dict[str, Any]]:
    f = run_dir / "steps.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def _median_step(steps: list[dict[str, Any]]) -> float | None:
    body = [s["step_s"] for i, s in enumerate(steps) if i > 0] or [s["step_s"] for s in steps]
    return statistics.median(body) if body else None


def downtime(steps: list[dict[str, Any]], rec: dict[str, Any]) -> dict[str, Any]:
    old_g, new_g = rec.get("old_generation"), rec.get("generation")
    old = [s for s in steps if s["generation"] == old_g]
    new = [s for s in steps if s["generation"] == new_g]
    if not old and rec.get("restored_step") is None:
        return {}
    before = old[-1] if old else {}
    if rec.get("restored_step") is not None:  # a rollback: compare with the checkpointed step (of
        before = next((s for s in reversed(steps) if s["step"] == rec["restored_step"]  # this generation
                       and s["generation"] <= old_g), {})                              # or one before)
    if not new or not old:  # a generation that never trained a step (the job or its node ended, or
        return _digests(rec, before)  # it failed as it started): no downtime; the digests still compare
    normal = _median_step(new) if len(new) > 1 else _median_step(old)
    last_old, first_new = old[-1], new[0]
    checks = last_old.get("digest_s", 0.0) + rec.get("digest_before_s", 0.0) + rec.get("digest_after_s", 0.0)
    # = (end of first new step - end of last old step) - normal step, computed as the pause
    # between the two steps plus what the first new step took beyond a normal one; a first step
    # faster than the median (noise) does not make the pause negative
    pause = first_new["time"] - first_new["step_s"] - last_old["time"] - checks
    out = {"downtime_s": pause + max(0.0, first_new["step_s"] - normal), "pause_s": pause,
           "first_step_extra_s": first_new["step_s"] - normal,
           "normal_step_s": normal, "last_old_step": last_old["step"], "first_new_step": first_new["step"],
           **_digests(rec, before)}
    return out


def _failed_at(steps: list[dict[str, Any]], rec: dict[str, Any]) -> dict[str, Any]:
    """A recovery's failed step and lost steps from the step log: the controller reads rank 0's
    progress between two polls, so the last step logged may be one it had not seen yet."""
    logged = [s["step"] for s in steps if s["generation"] == rec.get("old_generation")]
    failed = max([rec["failed_at_step"], *logged])
    out = {"failed_at_step": failed, "lost_steps": max(0, failed - rec["restored_step"])}
    if "steps_unlogged" in rec:
        seen = set(logged)
        out["steps_unlogged"] = [k for k in rec["steps_unlogged"] if k not in seen]
    return out


def _digests(rec: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The state digest right before the handoff (the switch's own, else the step's it was cut
    at) and right after it, and whether they are equal where both are known."""
    out = {"digest_before": rec.get("digest_before") or before.get("digest"), "digest_after": rec.get("digest_after")}
    if out["digest_before"] is not None and out["digest_after"] is not None:
        out["digest_equal"] = out["digest_before"] == out["digest_after"]
    # (the state could not be digested as it stood: the check's finding, the switch's or the step's)
    err = rec.get("digest_error") or (before.get("digest_error") if not rec.get("digest_before") else None)
    if err:
        out["digest_error"] = err
    return out


def _prepare_windows(events: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(old generation, from the event, to the switch) of every live handoff."""
    return [(e["old_generation"], e["t_event"], e["switch_start"]) for e in events
            if "switch_start" in e and "old_generation" in e]


BASELINE_STEPS = 20


def preparing_ratios(steps: list[dict[str, Any]], events: list[dict[str, Any]],
                     baseline_steps: int | None = BASELINE_STEPS) -> tuple[list[float], int]:
    """Steps that ran while a Shadow World was prepared (from the event, joiners booting included,
    to the switch), each divided by a baseline of the same generation (same configuration): the
    median of the ``baseline_steps`` steps just before its window outside any window; with
    ``None``, of all the generation's steps outside windows. Step times drift over a run (by about
    1% within a generation on the GPUs, by 15% on the 2-core CPU machine), so the neighbouring
    steps are the fair comparison. The first step of each generation is left out. Returns the
    ratios and the count of steps outside the windows."""
    windows = sorted(_prepare_windows(events), key=lambda w: w[1])
    by_gen: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        by_gen.setdefault(s["generation"], []).append(s)
    rel, n_calm = [], 0
    for g, gen_steps in by_gen.items():
        body = gen_steps[1:]
        window_of = [next((w for w in windows if w[0] == g and w[1] < s["time"] <= w[2] + 1e-9), None)
                     for s in body]
        calm = [s for s, w in zip(body, window_of) if w is None]
        n_calm += len(calm)
        if not calm:
            continue
        for w in windows:
            prep = [s["step_s"] for s, x in zip(body, window_of) if x == w]
            if not prep:
                continue
            before = [s["step_s"] for s in calm if s["time"] <= w[1]]
            ref = before[-baseline_steps:] if baseline_steps and before else [s["step_s"] for s in calm]
            base = statistics.median(ref)
            rel += [x / base for x in prep]
    return rel, n_calm


def placebo_ratios(steps: list[dict[str, Any]], events: list[dict[str, Any]],
                   baseline_steps: int = BASELINE_STEPS) -> list[float]:
    """The same estimate where nothing was prepared: for each window of n preparing steps, the
    last n steps before it (at most as many as leave ``baseline_steps`` before them), each over
    the median of the ``baseline_steps`` steps before those. What ``preparing_ratios`` gives when
    only the machine's drift is at work: the resolution of the steady-state overhead."""
    out = []
    for w in _prepare_windows(events):
        gen = [s for s in steps if s["generation"] == w[0]][1:]
        before = [s["step_s"] for s in gen if s["time"] <= w[1]]
        n = min(sum(1 for s in gen if w[1] < s["time"] <= w[2] + 1e-9), len(before) - baseline_steps)
        if n > 0:
            base = statistics.median(before[-n - baseline_steps:-n])
            out += [x / base for x in before[-n:]]
    return out


def median_ci95(windows: list[list[float]], draws: int = 2000) -> list[float] | None:
    """Bootstrap 95% interval of the pooled median ratio minus 1, resampling whole windows (one
    per event: step times drift together over tens of steps, so the steps of one window are not
    independent samples). None with fewer than two windows."""
    windows = [w for w in windows if w]
    if len(windows) < 2:
        return None
    rng = random.Random(0)
    meds = sorted(statistics.median([q for w in rng.choices(windows, k=len(windows)) for q in w]) - 1
                  for _ in range(draws))
    return [meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]]


def pooled_overhead(steps: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The steady-state overhead of several events pooled (every preparing step of each), with
    bootstrap intervals over the events, and the placebo beside it: what the benchmarks report."""
    ratios, _ = preparing_ratios(steps, events)
    windows = [preparing_ratios(steps, [e])[0] for e in events]  # one per event: the resampled unit
    placebo_windows = [placebo_ratios(steps, [e]) for e in events]
    placebo = [q for w in placebo_windows for q in w]
    return {"steady_overhead": statistics.median(ratios) - 1 if ratios else None,
            "steady_overhead_ci95": median_ci95(windows), "events": len(events), "steps_preparing": len(ratios),
            "steady_overhead_placebo": statistics.median(placebo) - 1 if placebo else None,
            "steady_overhead_placebo_ci95": median_ci95(placebo_windows), "steps_placebo": len(placebo),
            "windows": windows, "placebo_windows": placebo_windows}


def steady_overhead(steps: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of the preparing steps' ratios (see ``preparing_ratios``) minus 1; also against
    the whole generation's steps outside windows (``steady_overhead_generation``)."""
    rel, n_calm = preparing_ratios(steps, events)
    if not rel:
        return {"steady_overhead": None, "steady_overhead_generation": None, "steps_preparing": 0,
                "steps_not_preparing": n_calm}
    whole, _ = preparing_ratios(steps, events, baseline_steps=None)
    return {"steady_overhead": statistics.median(rel) - 1,
            "steady_overhead_generation": statistics.median(whole) - 1, "steps_preparing": len(rel),
            "steps_not_preparing": n_calm}


def prepare_stall(steps: list[dict[str, Any]], rec: dict[str, Any]) -> float | None:
    """Seconds without a step, beyond the usual time between two steps, during an event's prepare
    window (from the event to the switch): boundary work of the preparation (communicator
    creation at a boundary, waiting on a rendezvous). Not in the downtime, which starts at the
    switch, nor in the steady-state overhead, which compares the steps' own times."""
    windows = _prepare_windows([rec])
    if not windows:
        return None
    g, a, b = windows[0]
    gen = [s for s in steps if s["generation"] == g]
    between = [(s, s["time"] - p["time"] - s["step_s"] - s.get("digest_s", 0.0)) for p, s in zip(gen, gen[1:])]
    calm = [x for s, x in between if not a < s["time"] <= b + 1e-9]
    usual = statistics.median(calm) if calm else 0.0
    return sum(max(0.0, x - usual) for s, x in between if a < s["time"] <= b + 1e-9)


def build(run_dir: Path, result: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    steps = read_steps(run_dir)
    events = []
    for rec in result["records"]:
        rec = {k: v for k, v in rec.items() if not k.startswith("_") and k != "plan"}
        if outcome_of(rec) in SETTLED:
            rec.update(downtime(steps, rec))
        if rec.get("restored_step") is not None and rec.get("failed_at_step") is not None:
            rec.update(_failed_at(steps, rec))
        if "switch_start" in rec:
            so = steady_overhead(steps, [rec])
            rec["steady_overhead"], rec["steps_preparing"] = so["steady_overhead"], so["steps_preparing"]
            rec["steady_overhead_generation"] = so["steady_overhead_generation"]
            rec["prepare_stall_s"] = prepare_stall(steps, rec)
        events.append(rec)
    pooled = pooled_overhead(steps, [e for e in events if "switch_start" in e])
    return {**meta, "mode": result["mode"], "wall_s": result["wall_s"], "steps": steps,
            "events": events, **steady_overhead(steps, events),
            **{k: pooled[k] for k in ("steady_overhead_ci95", "steady_overhead_placebo",
                                      "steady_overhead_placebo_ci95", "steps_placebo")}}


WIDE = 0.10  # an interval wider than this many points says nothing of an overhead of a few tenths


def overhead_line(report: dict[str, Any]) -> str:
    """The steady-state overhead as a run can state it: with its 95% interval and the placebo's
    beside it (what step times drift by with nothing prepared), or why it was not measured. One
    median of a few steps on a shared machine is no figure (``make demo`` once printed +69.52%)."""
    so, ci = report.get("steady_overhead"), report.get("steady_overhead_ci95")
    n = report.get("steps_preparing", 0)
    if so is None or ci is None:
        return (f"steady-state overhead: not measured ({n} steps beside a preparation, in fewer than two "
                f"windows with calm steps before them; `liver bench reconfig` measures it with a placebo)")
    pl, pci = report.get("steady_overhead_placebo"), report.get("steady_overhead_placebo_ci95")
    line = f"steady-state overhead {so:+.2%} (95% interval {ci[0]:+.2%} to {ci[1]:+.2%}, {n} steps)"
    if pl is not None and pci is not None:
        line += f"; placebo {pl:+.2%} ({pci[0]:+.2%} to {pci[1]:+.2%}): "
        line += ("within the drift of step times" if ci[0] <= pci[1] and pci[0] <= ci[1] else
                 "beyond the drift of step times")
    else:
        line += "; no placebo (too few calm steps before the preparations)"
    if ci[1] - ci[0] > WIDE:
        line += "; too wide to tell an overhead from step-time noise here: `liver bench reconfig` measures it"
    return line


def summary(report: dict[str, Any]) -> str:
    rows = [f"{'#':>2}  {'event':<28} {'old -> new':<26} {'at step':>7} {'switched':>8} {'downtime':>9} "
            f"{'prepare':>8} {'moved':>10}  status"]
    for i, e in enumerate(report["events"], 1):
        ev = e["event"]
        what = ev["kind"] + (f" {ev['gpus']}" if ev.get("gpus") else "")
        move = f"{e.get('old', '?')} -> {e.get('new', '?')}"
        dt = f"{e['downtime_s']:.3f}s" if "downtime_s" in e else "-"
        pr = f"{e['prepare_s']:.2f}s" if "prepare_s" in e else "-"
        mv = f"{e['bytes_moved'] / 2**20:.1f}MiB" if "bytes_moved" in e else "-"
        status = e["status"]
        if e.get("lost_steps") is not None and outcome_of(e) in WITHOUT_CHECKPOINT:
            status += f" (no rollback: on from step {e['restored_step']}, {e['lost_steps']} steps lost)"
        elif e.get("lost_steps") and e.get("restored_step") is not None:
            status += f" (rolled back {e['lost_steps']} steps to step {e['restored_step']})"
        if e.get("digest_equal") is not None:
            status += ", digest " + ("equal" if e["digest_equal"] else "DIFFERENT")
        elif e.get("digest_error"):
            status += ", NO DIGEST (see digest_error)"
        if e.get("deadline_met") is not None:
            status += ", deadline " + ("met" if e["deadline_met"] else "MISSED")
        # the step the event arrived after, and the last step on the old generation (switched after)
        at = str(e["step_at_event"]) if e.get("step_at_event") is not None else str(e.get("failed_at_step", "-"))
        sw = str(e["last_old_step"]) if e.get("last_old_step") is not None else "-"
        rows.append(f"{i:>2}  {what:<28} {move:<26} {at:>7} {sw:>8} {dt:>9} {pr:>8} {mv:>10}  {status}")
    rows.append(f"steps: {len(report['steps'])}, wall {report['wall_s']:.1f} s; " + overhead_line(report))
    cpu = max((e.get("prepare_cpu_s") or 0.0 for e in report["events"]), default=0.0)
    if cpu:  # what a preparation itself took from a training process, apart from the machine's noise
        rows.append(f"preparation's own CPU time, busiest training process: up to {cpu * 1e3:.1f} ms per event")
    return "\n".join(rows)


def timeline(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    if not steps:
        return
    t0 = steps[0]["time"] - steps[0]["step_s"]
    fig, ax = plt.subplots(figsize=(10, 4))
    gens = sorted({s["generation"] for s in steps})
    cmap = plt.get_cmap("tab10")
    for g in gens:
        pts = [s for s in steps if s["generation"] == g]
        ax.plot([s["time"] - t0 for s in pts], [s["step"] for s in pts], ".", color=cmap(g % 10),
                label=f"gen {g}: {pts[0]['parallel']}")
    for e in report["events"]:
        if "t_event" in e:  # prepare: from the event until every process was ready
            end = e.get("t_ready", e.get("switch_start", e.get("stopped_at", e["t_event"])))
            ax.axvspan(e["t_event"] - t0, end - t0, color="gold", alpha=0.3, lw=0)
        if "downtime_s" in e:  # the gap without training steps, and the checks inside it
            old = [s for s in steps if s["step"] == e["last_old_step"] and s["generation"] == e["old_generation"]]
            new = [s for s in steps if s["generation"] == e["generation"]]
            if old and new:
                ax.axvspan(old[-1]["time"] - t0, new[0]["time"] - t0, color="red", alpha=0.25, lw=0)
            if "switch_start" in e:
                for a, b in ((e["switch_start"] - e.get("digest_before_s", 0.0), e["switch_start"]),
                             (e["switch_end"], e["switch_end"] + e.get("digest_after_s", 0.0))):
                    ax.axvspan(a - t0, b - t0, color="grey", alpha=0.4, lw=0)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("step")
    ax.set_title(f"liver run --mode {report['mode']}: steps over time\n(gold: prepare; red: no step "
                 "runs; grey: state digest checks, left out of downtime)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
