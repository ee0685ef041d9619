"""Calibration: a profile's parameters fitted to this project's measured runs, and the check of the
fit on events it did not see.

``measurements(results)`` reads every ``gpu_reconfig.json`` under bench/results that holds live and
restart events (the handoffs benchmark on H200), the step times of its reports, the planner's speed
(``plan.json``) and a joiner's boot (``boot.json``). ``fit(events, steps, ...)`` derives each
parameter by a stated rule: a median of per-event ratios, or least squares on the events (below,
per parameter). ``validate`` fits on all events but one and predicts that one (leave-one-out):
its live downtime, transfer, preparation and restart downtime.

    liver sim calibrate [--results bench/results] [--out liver/sim/calibration.json] [--check]
    liver sim validate [--json]
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liver.sim.profile import CALIBRATION, GB, H200_CLUSTER
from liver.topology import ParallelConfig

PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A800": 312e12}
# what two GPUs of one host cannot show, stated (README: "Simulator")
STATED = {
    "group_growth_s": (0.4, "stated setting: NCCL communicator set-up grows about 0.4 s per doubling of the ranks"),
    "rendezvous_s_per_rank": (0.002, "stated setting: the store's rendezvous, 2 ms a rank"),
    "host_bw": (25 * GB, "stated setting: pinned host copies, 25 GB/s a GPU"),
    "cuda_init_s": (0.0, "measured together with process_start_s (a fresh interpreter's imports and CUDA)"),
    "inter_bw": (H200_CLUSTER["inter_bw"], "stated setting: 8 x 400 Gb/s NICs a node, 50 GB/s a GPU"),
    "storage_cap_bw": (H200_CLUSTER["storage_cap_bw"], "stated setting: a 100 GB/s parallel file system"),
    "dp_overlap": (0.5, "stated setting: half of the gradient all-reduce hidden behind the backward pass"),
    "node_size": (8, "stated setting: 8 GPUs a node"),
    "memory_bytes": (141e9, "the H200's memory"),
    "detect_s": (5.0, "stated setting: a fail-stop noticed within 5 s (heartbeats, collective timeouts)"),
}


# measured directly: the file under bench/results, and what it says
DIRECT = {
    "plan_s_per_krank": ("cpu-planner-speed/plan.json",
                         "measured: the planner on GPT-3 175B at 1,024 to 2,048 ranks, per 1,000 ranks"),
    "joiner_boot_s": ("cpu-joiner-boot/boot.json", "measured: a joiner forked from the zygote, before its mock world (CPU)"),
    "dp_kill_stall_s": ("cpu-heal-vs-torchft/side_by_side.json",
                        "measured: torchft 0.2.0, a replica SIGKILLed, the survivor's stall and uncommitted step "
                        "(median; CPU machine, torchft's default heartbeats)"),
    "dp_join_stall_s": ("cpu-heal-vs-torchft/join.json",
                        "measured: torchft 0.2.0, a replica joins, the other's stall (median; CPU machine; its "
                        "0.15 GB of state sent over loopback included)"),
}


@dataclass(frozen=True)
class Event:
    """One measured handoff, with its restart counterpart."""

    source: str
    kind: str
    params: int
    old: ParallelConfig
    new: ParallelConfig
    downtime_live_s: float
    transfer_s: float
    switch_s: float
    prepare_s: float
    groups_s: float
    mock_s: float
    max_rank_bytes: int
    downtime_restart_s: float
    save_s: float
    load_s: float
    start_s: float
    init_s: float
    fresh: bool            # the restart's processes were fresh interpreters (not forked)

    @property
    def joiners(self) -> bool:
        return self.new.world_size > self.old.world_size


@dataclass(frozen=True)
class Step:
    source: str
    params: int
    tokens: int
    parallel: ParallelConfig
    step_s: float
    peak_flops: float


def _par(text: str) -> ParallelConfig:
    """``tp2pp1dp1`` as the reports write it."""
    t, rest = text[2:].split("pp")
    p, d = rest.split("dp")
    return ParallelConfig(tp=int(t), pp=int(p), dp=int(d))


def measurements(results: Path) -> tuple[list[Event], list[Step], dict[str, float]]:
    """Every measured event and step of ``results`` (bench/results), and the direct measurements."""
    events, steps, direct = [], [], {}
    for f in sorted(results.glob("*/gpu_reconfig.json")):
        d = json.loads(f.read_text())
        if not d.get("events") or "downtime_restart_s" not in d["events"][0] or not d.get("gpus"):
            continue
        fresh = "forked" not in f.parent.name
        for e in d["events"]:
            events.append(Event(source=f"{f.parent.name}:{e['event']}:{e['old']}->{e['new']}", kind=e["event"],
                                params=d["params"], old=_par(e["old"]), new=_par(e["new"]),
                                downtime_live_s=e["downtime_live_s"], transfer_s=e["transfer_s"], switch_s=e["switch_s"],
                                prepare_s=e["prepare_s"], groups_s=e["groups_s"], mock_s=e["mock_warmup_s"],
                                max_rank_bytes=e["max_rank_bytes"], downtime_restart_s=e["downtime_restart_s"],
                                save_s=e["restart_save_s"], load_s=e["restart_load_s"],
                                start_s=e["restart_process_start_s"], init_s=e["restart_group_init_s"], fresh=fresh))
        rep = f.parent / "report-live.json"
        if rep.exists():
            r = json.loads(rep.read_text())
            job = r["job"]
            tokens = job["train"]["global_batch"] * job["model"]["seq_len"]
            peak = next((v for k, v in PEAK_BF16.items() if k in d["gpus"][0]), None)
            by: dict[str, list[float]] = {}
            for s in r["steps"]:
                by.setdefault(s["parallel"], []).append(s["step_s"])
            for par, ts in by.items():
                if len(ts) >= 5 and peak:
                    steps.append(Step(f.parent.name, d["params"], tokens, _par(par), statistics.median(ts[2:]), peak))
    plan = results / DIRECT["plan_s_per_krank"][0]
    if plan.exists():
        rows = json.loads(plan.read_text())
        direct["plan_s_per_krank"] = statistics.median(r["plan_s"] / (max(r["ranks_old"], r["ranks_new"]) / 1000)
                                                       for r in rows)
    for key in ("dp_kill_stall_s", "dp_join_stall_s"):
        f = results / DIRECT[key][0]
        if f.exists():  # torchft's replicas: the median time the ones that stay lose to the event
            direct[key] = json.loads(f.read_text())["torchft"]["total_lost_s"]
    boot = results / DIRECT["joiner_boot_s"][0]
    if boot.exists():
        rows = json.loads(boot.read_text())
        direct["joiner_boot_s"] = next(r["wall_s"] for r in rows if r["start"] != "fresh interpreter")
    return events, steps, direct


def _median(xs: list[float], what: str) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        raise ValueError(f"calibration: no measured event gives {what}")
    return statistics.median(xs)


def _lsq(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares of ys on the columns of xs, in relative terms (each row over its y: the
    small events count as much as the large ones)."""
    import numpy as np

    a, b = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    w = 1.0 / np.maximum(np.abs(b), 1e-9)
    a, b = a * w[:, None], b * w
    sol, *_ = np.linalg.lstsq(a, b, rcond=None)
    return [float(v) for v in sol]


def state_gb(e: Event) -> float:
    return e.params * 14 / e.new.world_size / GB


def fit(events: list[Event], steps: list[Step], direct: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """The profile's values, and where each came from."""
    v: dict[str, float] = {}
    src: dict[str, str] = {}
    # live quantities from the runs of one code version (the fresh-interpreter restart runs;
    # the forked-restart run is older, its preparation differs: restart quantities only)
    same = [e for e in events if e.fresh] or events
    moving = [e for e in same if e.max_rank_bytes > 0 and e.transfer_s > 0]
    v["intra_bw"] = _median([e.max_rank_bytes / e.transfer_s for e in moving], "a transfer")
    src["intra_bw"] = "median of the busiest rank's bytes / the measured transfer time"
    v["switch_fixed_s"] = max(0.0, _median([e.switch_s - e.transfer_s for e in same], "a switch"))
    src["switch_fixed_s"] = "median of switch time less transfer time"
    v["first_step_s"] = max(0.0, _median([e.downtime_live_s - e.switch_s for e in moving], "a first step"))
    src["first_step_s"] = ("median of downtime less switch time where state moved (the new generation's "
                           "first step: its allocations and first collectives)")
    joining = [e for e in same if e.joiners]
    v["group_init_s"] = _median([e.groups_s for e in joining], "a joiner's groups")
    src["group_init_s"] = "median of a new generation's group set-up with a joiner (2 ranks)"
    v["mock_s_per_gparam"] = _median([e.mock_s / (e.params / e.new.world_size / 1e9) for e in joining], "a mock warm-up")
    src["mock_s_per_gparam"] = "median of a joiner's mock warm-up per billion parameters it holds"
    v["prepare_joiner_s"] = max(0.0, _median([e.prepare_s - e.groups_s - e.mock_s for e in joining], "a joiner's rest"))
    src["prepare_joiner_s"] = "median of a scale-out's preparation less its groups and mock warm-up"
    staying = [e for e in same if not e.joiners]
    base, per_state, per_moved = _nnls([[1.0, state_gb(e), e.max_rank_bytes / GB] for e in staying],
                                       [e.prepare_s for e in staying])
    v["prepare_base_s"], v["prepare_s_per_gb"], v["prepare_s_per_moved_gb"] = base, per_state, per_moved
    src["prepare_base_s"] = src["prepare_s_per_gb"] = src["prepare_s_per_moved_gb"] = (
        "least squares (coefficients 0 or more) over the handoffs on the same processes: preparation against a "
        "rank's new state and the busiest rank's bytes (GB); paced at the companion share, so it is the pace's figure as much as the machine's")
    total = [e.params * 12 for e in events]
    fixed, inv_bw = _lsq([[1.0, t / e.old.world_size] for t, e in zip(total, events)], [e.save_s for e in events])
    v["save_fixed_s"], v["save_bw_per_rank"] = max(0.0, fixed), 1 / inv_bw
    src["save_fixed_s"] = src["save_bw_per_rank"] = "least squares: save time against the bytes a rank writes (DCP)"
    fixed, inv_bw = _lsq([[1.0, t / e.new.world_size] for t, e in zip(total, events)], [e.load_s for e in events])
    v["load_fixed_s"], v["load_bw_per_rank"] = max(0.0, fixed), 1 / inv_bw
    src["load_fixed_s"] = src["load_bw_per_rank"] = \
        "least squares: load time against the bytes a rank reads and reshards (DCP)"
    fresh = [e for e in events if e.fresh]
    v["process_start_s"] = _median([e.start_s for e in fresh], "a fresh process start")
    src["process_start_s"] = "median of the restart's process start (fresh interpreters: imports, CUDA)"
    v["restart_fixed_s"] = max(0.0, _median([e.downtime_restart_s - e.save_s - e.load_s - e.start_s - e.init_s
                                             for e in events], "a restart's rest"))

    src["restart_fixed_s"] = "median of the restart downtime less its save, load, start and group parts"
    single = [s for s in steps if s.parallel.world_size == 1]
    v["mfu"] = _median([6 * s.params * s.tokens / (s.peak_flops * s.step_s) for s in single], "a one-GPU step")
    src["mfu"] = "median of 6 N tokens / (peak x step time) over one-GPU steps"
    v["peak_flops"] = steps[0].peak_flops if steps else 989e12
    src["peak_flops"] = "the GPU's bf16 dense peak"
    for k, where in DIRECT.items():
        if k not in direct:
            raise ValueError(f"calibration: {k} needs bench/results/{where[0]}")
        v[k], src[k] = direct[k], where[1]
    for k, (val, why) in STATED.items():
        v[k], src[k] = val, why
    return v, src


# ---- prediction and validation --------------------------------------------------------------
def predict(e: Event, v: dict[str, float]) -> dict[str, float]:
    """What the fitted values say of a measured event (on its own machine: one node)."""
    transfer = e.max_rank_bytes / v["intra_bw"]
    downtime = v["switch_fixed_s"] + transfer + (v["first_step_s"] if e.max_rank_bytes else 0.0)
    if e.joiners:
        prepare = v["group_init_s"] + v["mock_s_per_gparam"] * e.params / e.new.world_size / 1e9 + v["prepare_joiner_s"]
    else:
        prepare = v["prepare_base_s"] + v["prepare_s_per_gb"] * state_gb(e) + v["prepare_s_per_moved_gb"] * \
            e.max_rank_bytes / GB
    total = e.params * 12
    restart = (v["save_fixed_s"] + total / (e.old.world_size * v["save_bw_per_rank"]) + v["load_fixed_s"]
               + total / (e.new.world_size * v["load_bw_per_rank"]) + (v["process_start_s"] if e.fresh else e.start_s)
               + e.init_s + v["restart_fixed_s"])
    return {"downtime_live_s": downtime, "transfer_s": transfer, "prepare_s": prepare, "downtime_restart_s": restart}


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


QUANTITIES = ("downtime_live_s", "transfer_s", "prepare_s", "downtime_restart_s")


def validate(events: list[Event], steps: list[Step], direct: dict[str, float]) -> dict[str, Any]:
    """Leave-one-out: each event predicted by the fit of all the others; relative errors."""
    rows = []
    for i, e in enumerate(events):
        v, _ = fit(events[:i] + events[i + 1:], steps, direct)
        p = predict(e, v)
        row = {"event": e.source}
        for q in QUANTITIES:
            meas = getattr(e, q)
            if q == "transfer_s" and e.max_rank_bytes == 0:
                continue  # nothing moved: no transfer to predict
            if q != "downtime_restart_s" and not e.fresh:
                continue  # (the live figures of the older, forked-restart run are not fitted)
            row[q] = {"measured": meas, "simulated": p[q], "error": (p[q] - meas) / meas if meas else 0.0}
        rows.append(row)
    summary = {}
    for q in QUANTITIES:
        errs = [abs(r[q]["error"]) for r in rows if q in r]
        worst = max((r for r in rows if q in r), key=lambda r: abs(r[q]["error"]))
        summary[q] = {"events": len(errs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
                      "worst_event": worst["event"], "within_5pct_median": statistics.median(errs) <= 0.05}
    return {"method": "leave-one-out over the measured events", "summary": summary,
            "noise_floor_same_event_twice": noise_floor(events), "events": rows}


HELD_OUT_DCP = "gpu-1x-native-pp-compat/dcp.json"  # liver bench dcp on one H200: not in the fit


def validate_dcp(path: Path, v: dict[str, float]) -> dict[str, Any]:
    """The restart model's save and load against DCP measured directly on one GPU (``liver bench
    dcp``: one rank, its whole state to local disk and /dev/shm), a held-out check; and the
    step-time model's one-GPU steps beside the measured ones (these are in the fit)."""
    d = json.loads(path.read_text())
    rows = []
    for r in d["rows"]:
        for where, m in r["dirs"].items():
            if "save_s" not in m or len(m["save_s"]) < 2:
                continue
            save = statistics.median(m["save_s"][1:])
            load = statistics.median(m["load_s"][1:])
            p_save = v["save_fixed_s"] + r["state_bytes"] / v["save_bw_per_rank"]
            p_load = v["load_fixed_s"] + r["state_bytes"] / v["load_bw_per_rank"]
            first_save, first_load = m["save_s"][0], m["load_s"][0]
            rows.append({"model": r["model"], "dir": where, "state_bytes": r["state_bytes"],
                         "save_s": {"measured": save, "simulated": p_save, "error": (p_save - save) / save},
                         "load_s": {"measured": load, "simulated": p_load, "error": (p_load - load) / load},
                         # a restart's save is its process's first (cold page cache, first pinned copies)
                         "first_save_s": {"measured": first_save, "simulated": p_save,
                                          "error": (p_save - first_save) / first_save},
                         "first_load_s": {"measured": first_load, "simulated": p_load,
                                          "error": (p_load - first_load) / first_load}})
    from liver.sim import costs
    from liver.sim.profile import Profile
    from liver.topology.presets import PRESETS

    prof = Profile(name="h200", **v, sources={})
    step_rows = []
    for r in d["rows"]:
        if r.get("model") in PRESETS and "step_s" in r:
            job = PRESETS[r["model"]]
            sim = costs.step_time(job, costs.layout(job, ParallelConfig()), prof)
            step_rows.append({"model": r["model"], "measured": r["step_s"], "simulated": sim,
                              "error": (sim - r["step_s"]) / r["step_s"]})
    return {"source": f"bench/results/{HELD_OUT_DCP}",
            "method": "held out: DCP save and load of one rank's whole state, measured directly, against the "
                      "restart model's fitted save and load (fitted to the restarts' saves and loads of 2-GPU runs); "
                      "the one-GPU step times are in the fit (its MFU), shown beside the model",
            "dcp": rows, "steps": step_rows,
            "median_abs_error": {q: statistics.median(abs(x[q]["error"]) for x in rows)
                                 for q in ("save_s", "load_s", "first_save_s", "first_load_s")}
            if rows else None}


# ---- CPU processes: the controller's target choice on this machine ---------------------------
CPU_TERMS = ("compute_s_per_flop", "layer_op_s", "tp_latency_s", "dp_latency_s", "p2p_latency_s", "step_fixed_s")
CPU_CORES = 2  # the machine the target benchmark ran on (bench/results/cpu-target-choice)


def _cpu_features(job, lay, cores: int) -> list[float]:
    """The step-time model's terms for CPU processes (``costs.step_time``), each with a unit
    coefficient: the fit finds the coefficients."""
    m, t = job.model, job.train
    micro = lay.num_micro_batches
    path = (micro + lay.pp - 1) * m.num_layers / lay.pp
    share = max(1.0, lay.size / cores)
    compute = 6 * m.num_params() * t.global_batch * m.seq_len / min(lay.size, cores) * (micro + lay.pp - 1) / micro
    return [compute, share * path, share * 4 * path * (lay.tp - 1), share * (lay.dp - 1) * (m.num_layers / lay.pp + 2),
            share * 2 * (micro + lay.pp - 1) * (lay.pp > 1), share]


def _nnls(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Relative least squares with every coefficient kept at 0 or above (terms whose fit goes
    negative are dropped, and the rest fitted again)."""
    keep = list(range(len(xs[0])))
    while True:
        sol = _lsq([[row[i] for i in keep] for row in xs], ys)
        if all(v >= 0 for v in sol):
            out = [0.0] * len(xs[0])
            for i, v in zip(keep, sol):
                out[i] = v
            return out
        keep.pop(min(range(len(sol)), key=lambda i: sol[i]))


def cpu_samples(path: Path) -> list[tuple[str, int, Any, float]]:
    """(shape, processes, layout, measured step time) of ``liver bench target``'s JSON."""
    from liver.bench.target import job_of
    from liver.sim.costs import layout

    out = []
    for r in json.loads(path.read_text())["rows"]:
        job = job_of(r["shape"])
        for par, t in r["measured_step_s"].items():
            out.append((r["shape"], r["processes"], layout(job, _par(par)), t))
    return out


def fit_cpu(samples) -> tuple[dict[str, float], dict[str, str]]:
    from liver.bench.target import job_of

    xs = [_cpu_features(job_of(shape), lay, CPU_CORES) for shape, _, lay, _ in samples]
    coef = _nnls(xs, [t for *_, t in samples])
    v = dict(zip(CPU_TERMS, coef))
    per_flop = v.pop("compute_s_per_flop")
    values = {"cores": CPU_CORES, "peak_flops": 1.0 / per_flop if per_flop > 0 else 1e30, "mfu": 1.0, **v}
    why = (f"relative least squares (coefficients 0 or more) over {len(samples)} configurations timed by "
           "liver bench target (bench/results/cpu-target-choice)")
    return values, {k: why for k in values} | {"cores": "the CPU machine's cores", "mfu": "folded into peak_flops"}


def check_choice(samples, values: dict[str, float]) -> list[dict[str, Any]]:
    """For each (shape, processes): the configuration the model with ``values`` chooses, and its
    measured step time over the fastest measured."""
    from liver.bench.target import job_of
    from liver.sim.costs import step_time
    from liver.sim.profile import Profile

    h200 = json.loads(CALIBRATION.read_text())["profiles"]["h200"]["values"] if CALIBRATION.exists() else {}
    prof = Profile(name="cpu", **{**h200, **values}) if h200 else None
    rows = []
    for key in dict.fromkeys((s, n) for s, n, _, _ in samples):
        cands = [(lay, t) for s, n, lay, t in samples if (s, n) == key]
        job = job_of(key[0])
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


def calibrate(results: Path) -> dict[str, Any]:
    events, steps, direct = measurements(results)
    if not events:
        raise ValueError(f"{results}: no measured handoffs (*/gpu_reconfig.json with live and restart events)")
    values, sources = fit(events, steps, direct)
    out = {"profiles": {"h200": {"values": values, "sources": sources,
                                 "measured_events": [e.source for e in events],
                                 "measured_steps": len(steps)}}}
    cpu = results / "cpu-target-choice" / "target.json"
    if cpu.exists():
        cv, cs = fit_cpu(cpu_samples(cpu))
        out["profiles"]["cpu"] = {"values": cv, "sources": cs}
    return out


def write(results: Path, out: Path = CALIBRATION) -> dict[str, Any]:
    data = calibrate(results)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def check(results: Path, out: Path = CALIBRATION) -> bool:
    """The committed file is what the measurements give (a reproducible fit)."""
    have = json.loads(out.read_text())
    want = json.loads(json.dumps(calibrate(results), sort_keys=True))
    return have == want
