"""The simulator's check against measurement: each measured event predicted by the cost model
(``costs.live``, ``costs.restart``, ``costs.step_time``) with a fit that did not see it.

``validate`` fits on all handoffs but one and predicts that one (leave-one-out): its live downtime,
transfer, preparation and restart downtime, beside how much the same event differs between two
measurements of it; ``validate_steps`` the steps the fit did not see; ``validate_held_out`` a
live-only run the fit never sees; ``validate_dcp`` DCP measured directly on one GPU;
``validate_choice`` the controller's target choice on CPU processes.

    liver sim validate [--results bench/results] [--json]
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from liver.sim.calibrate import fit, fit_cpu, profile_of
from liver.sim.results import Event, Step, cpu_samples
from liver.policy.profile import CALIBRATION
from liver.policy.workload import Workload
from liver.topology import ParallelConfig


def predict(e: Event, v: dict[str, float]) -> dict[str, float]:
    """What the simulator's cost model (``costs.live``, ``costs.restart``) with the fitted values
    says of a measured event, on its own machine (one node), given the run's history."""
    return _figures(e.job, e.old, e.new, profile_of(v), e.kinds, e.first_nccl, e.share, e.fresh)


def _figures(work: Workload, old: ParallelConfig, new: ParallelConfig, prof, kinds: frozenset[str], first_nccl: bool,
             share: float, fresh: bool = True) -> dict[str, float]:
    """The cost model's figures of one handoff: its live pause, transfer and preparation
    (``costs.live``), and its restart's downtime (``costs.restart``). A scale-in is one that names
    no node, as a bench's are: its leaving ranks are the controller's choice."""
    from liver.policy import costs

    plan = costs.plan_work(work, old, new, chosen_leaving=True)
    h = costs.live(work, old, new, prof, plan=plan, kinds=kinds, first_nccl=first_nccl, share=share)
    r = costs.restart(work, old, new, prof, fresh=fresh)
    return {"downtime_live_s": h.downtime_s, "transfer_s": h.transfer_s, "prepare_s": h.prepare_s,
            "downtime_restart_s": r.downtime_s}


def beside(work: Workload, run: list[tuple[ParallelConfig, ParallelConfig]], profile: str, share: float,
           nccl: bool) -> list[dict[str, float]]:
    """The simulator's figures for each handoff of a run as it happens (``run``: each handoff's old
    and new configuration, in order), to set beside what was measured: the cost model with the
    profile (``liver/policy/calibration.json``), the run's companion ``share`` and its history of
    communicators (``results.replay``; ``nccl``: whether its first NCCL collectives are paid)."""
    from liver.policy.profile import load
    from liver.sim.results import replay

    prof = load(profile)
    return [{"profile": profile, **_figures(work, old, new, prof, kinds, first_nccl and nccl, share)}
            for (old, new), (kinds, first_nccl) in zip(run, replay(work, run))]


def noise_floor(events: list[Event]) -> dict[str, float]:
    """The same event measured twice in one run (the x2-twice scenario): the median relative
    difference between the two, per quantity. No model of a single figure can do better."""
    by: dict[str, list[Event]] = {}
    for e in events:
        by.setdefault(e.source, []).append(e)
    out = {}
    for q in QUANTITIES:
        diffs = [abs(getattr(a, q) - getattr(b, q)) / ((getattr(a, q) + getattr(b, q)) / 2)
                 for pair in by.values() if len(pair) == 2 for a, b in [pair] if getattr(a, q) + getattr(b, q) > 0]
        out[q] = statistics.median(diffs) if diffs else None
    return out


def moves(e: Event) -> bool:
    """Whether the event's plan sends or copies anything (else it has no transfer to predict)."""
    from liver.policy import costs

    w = e.work
    return bool(w.io_bytes or w.copy_bytes)


QUANTITIES = ("downtime_live_s", "transfer_s", "prepare_s", "downtime_restart_s")
ACROSS_RUNS = ("downtime_live_s", "transfer_s", "save_s", "load_s")  # what two runs' code paths share


def noise_floor_across_runs(events: list[Event]) -> dict[str, float | None]:
    """The same handoff (model, kind, configurations) in two different runs on the same kind of
    machine: the median relative difference, per quantity (the restart's save and load: its two
    largest parts, the same code in every run). No model of one run's figures can do better."""
    out: dict[str, float | None] = {}
    for q in ACROSS_RUNS:
        diffs = [abs(getattr(a, q) - getattr(b, q)) / ((getattr(a, q) + getattr(b, q)) / 2)
                 for i, a in enumerate(events) for b in events[i + 1:]
                 if a.source.split(":")[0] != b.source.split(":")[0]
                 and (a.model, a.kind, a.old, a.new) == (b.model, b.kind, b.old, b.new)
                 and getattr(a, q) + getattr(b, q) > 0]
        out[q] = statistics.median(diffs) if diffs else None
    return out


def _score(pairs: list[tuple[Event, dict[str, float]]], quantities: tuple[str, ...]) -> dict[str, Any]:
    """Each event's measured figures against the model's (``pairs``: an event and its prediction):
    per event, and per handoff with its repeats pooled (the median of the measured against the
    median of the model's), with the median and worst relative error of each."""
    rows, pooled = [], {}
    for e, p in pairs:
        row = {"event": e.source}
        for q in quantities:
            if q == "transfer_s" and not moves(e):
                continue  # nothing sent or copied: no transfer to predict
            meas = getattr(e, q)
            row[q] = {"measured": meas, "simulated": p[q], "error": (p[q] - meas) / meas if meas else 0.0}
            pooled.setdefault((e.source, q), []).append((meas, p[q]))
        rows.append(row)
    by_handoff = []
    for (src, q), got in pooled.items():
        meas, sim = statistics.median(m for m, _ in got), statistics.median(x for _, x in got)
        by_handoff.append({"handoff": src, "quantity": q, "repeats": len(got), "measured_median": meas,
                           "simulated_median": sim, "error": (sim - meas) / meas if meas else 0.0})
    summary = {}
    for q in quantities:
        errs = [abs(r[q]["error"]) for r in rows if q in r]
        worst = max((r for r in rows if q in r), key=lambda r: abs(r[q]["error"]))
        pool = [abs(b["error"]) for b in by_handoff if b["quantity"] == q]
        summary[q] = {"events": len(errs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
                      "worst_event": worst["event"], "within_5pct_median": statistics.median(errs) <= 0.05,
                      "handoffs": len(pool), "pooled_median_abs_error": statistics.median(pool),
                      "pooled_worst_abs_error": max(pool)}
    return {"summary": summary, "by_handoff": by_handoff, "events": rows}


def validate_cpu_handoffs(events: list[Event], base: dict[str, float]) -> dict[str, Any] | None:
    """Leave-one-out over the handoffs measured on CPU processes (``results.cpu_events``): each
    predicted by the CPU fit of the others (``calibrate.cpu_handoffs``) over ``base``, the CPU
    profile's other values (its steps' fit, the direct measurements and stated settings)."""
    from liver.sim.calibrate import cpu_handoffs

    if len(events) < 3:
        return None
    pairs = [(e, predict(e, {**base, **cpu_handoffs(base, {}, events[:i] + events[i + 1:])[0]}))
             for i, e in enumerate(events)]
    return {"method": "leave-one-out over the handoffs measured on CPU processes (gloo): each predicted by the "
                      "CPU profile fitted to the others",
            "sources": sorted({e.source.split(":")[0] for e in events}), **_score(pairs, QUANTITIES),
            "noise_floor_same_event_twice": noise_floor(events)}


def validate_cpu_reconfig(events: list[Event], fitted: list[Event], base: dict[str, float]) -> dict[str, Any] | None:
    """The CPU runs of ``liver bench reconfig`` (``results.cpu_reconfig_events``), never in a fit,
    each predicted by the CPU profile fitted to every handoff of ``fitted`` (``results.cpu_events``)
    over ``base``: their live downtime, transfer, preparation and restart downtime."""
    from liver.sim.calibrate import cpu_handoffs

    if not events or len(fitted) < 3:
        return None
    v = {**base, **cpu_handoffs(base, {}, fitted)[0]}
    return {"method": "held out: each scenario of liver bench reconfig on CPU processes (gloo; the medians over "
                      "its live events and its restarts), predicted by the CPU profile fitted to every handoff of "
                      "liver bench handoffs --backend gloo",
            "sources": sorted({e.source.split(":")[0] for e in events}),
            **_score([(e, predict(e, v)) for e in events], QUANTITIES)}


def validate_held_out(held: list[Event], v: dict[str, float], fitted: list[Event]) -> dict[str, Any] | None:
    """Events the fit did not see (``held_out``), predicted by the fit ``v`` of the measured ones
    (``fitted``), scored as ``_score`` does; which handoffs are of configurations no fitted event has."""
    if not held:
        return None
    seen = {(e.model, e.old, e.new) for e in fitted}
    scored = _score([(e, predict(e, v)) for e in held], QUANTITIES[:3])
    unseen = sorted({e.source for e in held if (e.model, e.old, e.new) not in seen})
    return {"sources": sorted({e.source.split(":")[0] for e in held}), "handoffs": len({e.source for e in held}),
            "handoffs_not_in_the_fit": unseen,
            "method": "held out: live-only runs, not in the fit; each event predicted from the fit of every "
                      "measured event (with its run's companion share and history of communicators); "
                      "pooled: a handoff's repeats in the run, median measured against median simulated",
            **scored}


def validate(events: list[Event], steps: list[Step], direct: dict[str, float],
             full: dict[str, float] | None = None) -> dict[str, Any]:
    """Leave-one-out: each event predicted by the fit of all the others; relative errors, per
    event and with a handoff's repeats in its run pooled (``_score``); and every measured step
    against the step-time model (``validate_steps``) with ``full``, the fit of them all."""
    pairs = [(e, predict(e, fit(events[:i] + events[i + 1:], steps, direct)[0])) for i, e in enumerate(events)]
    return {"method": "leave-one-out over the measured events", **_score(pairs, QUANTITIES),
            "noise_floor_same_event_twice": noise_floor(events),
            "noise_floor_same_event_other_run": noise_floor_across_runs(events),
            "steps": validate_steps(steps, full or fit(events, steps, direct)[0])}


def validate_steps(steps: list[Step], v: dict[str, float]) -> dict[str, Any]:
    """Each measured step against ``costs.step_time`` with the fitted values: the one-GPU steps are
    the fit's (the sustained share of the peak and its width); the two-GPU ones (TP and DP over
    NVLink) are held out."""
    from liver.policy import costs
    from liver.topology.presets import PRESETS

    prof = profile_of(v)
    rows = []
    for s in steps:
        job = Workload.reference(PRESETS[s.model])
        sim = costs.step_time(job, costs.layout(job, s.parallel), prof)
        rows.append({"run": s.source, "model": s.model, "parallel": s.parallel.short(), "in_fit": s.parallel.world_size == 1,
                     "measured_s": s.step_s, "simulated_s": sim, "error": (sim - s.step_s) / s.step_s})
    held = [abs(r["error"]) for r in rows if not r["in_fit"]]
    return {"rows": rows, "held_out": {"steps": len(held), "median_abs_error": statistics.median(held) if held else None,
                                       "worst_abs_error": max(held, default=None)}}


# liver bench dcp on one H200, in two sessions, and at shapes beyond the presets: not in the fit
HELD_OUT_DCP = ("gpu-1x-native-pp-compat/dcp.json", "gpu-1x-sim-copy/dcp.json", "gpu-1x-sim-shapes/dcp.json")


def held_out_dcp(results: Path) -> list[Path]:
    """The files of ``HELD_OUT_DCP`` that ``results`` holds."""
    return [results / f for f in HELD_OUT_DCP if (results / f).exists()]


def _job(r: dict[str, Any]) -> Workload | None:
    """The job a ``liver bench dcp`` row measured (the reference engine's): the one it recorded,
    else its preset's."""
    from liver.config.fields import from_dict, with_model
    from liver.topology import JobConfig, ModelConfig
    from liver.topology.presets import PRESETS

    job = with_model(from_dict(JobConfig, r["job"], "job"), ModelConfig) if "job" in r else PRESETS.get(r.get("model"))
    return None if job is None else Workload.reference(job)


def validate_dcp(paths: list[Path], v: dict[str, float]) -> dict[str, Any]:
    """The restart model's save and load (``costs.restart`` of one rank) against DCP measured
    directly on one GPU (``liver bench dcp``: one rank, its whole state to local disk and
    /dev/shm), a held-out check; and the step-time model against its one-GPU steps: of the
    presets' shapes (the fit's are the handoff runs'), and, held out, of shapes beyond them."""
    from liver.policy import costs
    from liver.topology.presets import PRESETS

    prof, one = profile_of(v), ParallelConfig()
    rows, step_rows = [], []
    for path in paths:
        for r in json.loads(path.read_text())["rows"]:
            job = _job(r)
            if job is None:
                continue
            model = costs.restart(job, one, one, prof)
            for where, m in r["dirs"].items():
                if "save_s" not in m or len(m["save_s"]) < 2:
                    continue
                measured = {"save_s": statistics.median(m["save_s"][1:]), "load_s": statistics.median(m["load_s"][1:]),
                            # a restart's save is its process's first (cold page cache, first pinned copies)
                            "first_save_s": m["save_s"][0], "first_load_s": m["load_s"][0]}
                sim = {"save_s": model.save_s, "load_s": model.load_s, "first_save_s": model.save_s,
                       "first_load_s": model.load_s}
                rows.append({"source": path.parent.name, "model": r["model"], "dir": where,
                             "state_bytes": r["state_bytes"],
                             **{q: {"measured": x, "simulated": sim[q], "error": (sim[q] - x) / x}
                                for q, x in measured.items()}})
            if "step_s" in r:
                t = costs.step_time(job, costs.layout(job, one), prof)
                step_rows.append({"source": path.parent.name, "model": r["model"], "hidden_size": job.facts.width,
                                  "params": job.facts.params, "preset_shape": PRESETS.get(r["model"]) == job.job,
                                  "measured": r["step_s"], "simulated": t, "error": (t - r["step_s"]) / r["step_s"]})
    beyond = [abs(x["error"]) for x in step_rows if not x["preset_shape"]]
    return {"sources": [f"bench/results/{p.parent.name}" for p in paths],
            "method": "held out: DCP save and load of one rank's whole state, measured directly, against the "
                      "restart model's fitted save and load (fitted to the restarts' saves and loads of 2-GPU runs); "
                      "one-GPU steps of the presets' shapes (the fit's are the handoff runs') and, held out, of shapes "
                      "beyond them (other hidden sizes: the share of the peak against the width)",
            "dcp": rows, "steps": step_rows,
            "steps_beyond_the_presets": {"steps": len(beyond), "median_abs_error": statistics.median(beyond) if beyond
                                         else None, "worst_abs_error": max(beyond, default=None)},
            "median_abs_error": {q: statistics.median(abs(x[q]["error"]) for x in rows)
                                 for q in ("save_s", "load_s", "first_save_s", "first_load_s")}
            if rows else None}


def check_choice(samples, values: dict[str, float]) -> list[dict[str, Any]]:
    """For each (shape, processes): the configuration the model with ``values`` chooses, and its
    measured step time over the fastest measured."""
    from liver.topology.presets import target_shape as job_of
    from liver.policy.costs import step_time
    from liver.policy.profile import Profile

    h200 = json.loads(CALIBRATION.read_text())["profiles"]["h200"]["values"] if CALIBRATION.exists() else {}
    prof = Profile(name="cpu", **{**h200, **values}) if h200 else None
    rows = []
    for key in dict.fromkeys((s, n) for s, n, _, _ in samples):
        cands = [(lay, t) for s, n, lay, t in samples if (s, n) == key]
        job = Workload.reference(job_of(key[0]))
        chosen = min(cands, key=lambda c: step_time(job, c[0], prof))
        fastest = min(cands, key=lambda c: c[1])
        rows.append({"shape": key[0], "processes": key[1], "chosen": chosen[0].parallel.short(),
                     "fastest": fastest[0].parallel.short(), "chosen_over_fastest": chosen[1] / fastest[1]})
    return rows


def validate_choice(path: Path) -> dict[str, Any]:
    """The CPU step-time model's choice against measurement: fitted on every shape (in sample)
    and fitted on the other shape only (out of sample)."""
    samples = cpu_samples(path)
    values, _ = fit_cpu(samples)
    rows = check_choice(samples, values)
    out_rows = []
    for shape in dict.fromkeys(s for s, *_ in samples):
        held = [x for x in samples if x[0] == shape]
        other, _ = fit_cpu([x for x in samples if x[0] != shape])
        out_rows += check_choice(held, other)

    def summary(rs):
        return {"cases": len(rs), "within_10pct": sum(r["chosen_over_fastest"] <= 1.10 for r in rs),
                "worst_ratio": max(r["chosen_over_fastest"] for r in rs)}
    return {"fitted_on_all": {**summary(rows), "rows": rows},
            "fitted_on_the_other_shape": {**summary(out_rows), "rows": out_rows}}
