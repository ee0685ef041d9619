"""Calibration: a profile's parameters fitted to this project's measured runs (read by
``results.py``; their check on events the fit did not see: ``validate.py``).

``fit(events, steps, direct)`` derives each parameter by a stated rule: a median of per-event
ratios, or least squares on the events (below, per parameter), beside the direct measurements and
the stated settings (``STATED``: what two GPUs of one host cannot show); ``fit_handoffs`` fits the
CPU processes' handoffs, ``fit_cpu`` their step times (the controller's target choice on this
machine).

    liver sim calibrate [--results bench/results] [--out liver/policy/calibration.json] [--check]
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from liver.policy.profile import CALIBRATION, GB, H200_CLUSTER
from liver.policy.workload import Workload
from liver.sim.results import CPU_HANDOFFS, DIRECT, Event, Step, cpu_events, cpu_samples, measurements

# what two GPUs of one host cannot show, stated (README: "Simulator")
STATED = {
    "group_growth_s": (1.0, "published measurement: 2.04 s a communicator of 8 ranks and 4.06 s of 32 (NCCL "
                            "on V100s over InfiniBand: 8 communicators of 8 ranks in 16.3 s, 32 of 32 in 130 s; "
                            "github.com/NVIDIA/nccl/issues/534, 2021-07-19), +1.0 s per doubling of the ranks; "
                            "two GPUs cannot measure the growth. (A 2.5-minute init on PyTorch's default path "
                            "'above certain K GPUs', github.com/NVIDIA/nccl/issues/1156, states no GPU count.)"),
    "cuda_init_s": (0.0, "measured together with process_start_s (a fresh interpreter's imports and CUDA)"),
    "inter_bw": (H200_CLUSTER["inter_bw"], "published system description: 400 Gb/s InfiniBand NICs, ten a host of "
                                            "eight H200s (NVIDIA's MLPerf Inference v4.1 H200-SXM-141GBx8 system, "
                                            "raw.githubusercontent.com/mlcommons/inference_results_v4.1/main/closed/"
                                            "NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json); counted one a GPU for "
                                            "training, 50 GB/s a GPU each way (the other two not counted)"),
    "storage_bw_per_gpu": (H200_CLUSTER["storage_bw_per_gpu"], "published system description: Meta's Tectonic file "
                                                                "system sustains 2 TB/s (7 TB/s peak) for the training "
                                                                "of Llama 3 on up to 16,384 H100s (The Llama 3 Herd of "
                                                                "Models, arXiv:2407.21783, section 3.3.1 'Storage'): a "
                                                                "job's share, 122 MB/s a GPU it holds"),
    "dp_overlap": (0.5, "stated setting: half of the gradient all-reduce hidden behind the backward pass"),
    "node_size": (8, "stated setting: 8 GPUs a node"),
    "memory_bytes": (141e9, "the H200's memory"),
    "detect_s": (5.0, "stated setting: a fail-stop noticed within 5 s (heartbeats, collective timeouts)"),
}


#: what ``fit_handoffs`` fits (the rest of a profile: direct measurements, stated settings, steps)
HANDOFF_KEYS = ("intra_bw", "transfer_share", "connect_p2p_s", "switch_fixed_s", "switch_s_per_gb", "first_step_s",
                "connect_tp_s", "connect_dp_s", "nccl_first_s", "group_init_s", "mock_s_per_gparam", "prepare_base_s",
                "prepare_joiner_s", "prepare_cpu_s_per_task", "prepare_stall_s", "prepare_stall_joiner_s",
                "save_fixed_s", "save_bw_per_rank", "load_fixed_s", "load_bw_per_rank", "process_start_s",
                "restart_fixed_s", "restart_s_per_gb")


def _median(xs: list[float], what: str) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        raise ValueError(f"calibration: no measured event gives {what}")
    return statistics.median(xs)


def profile_of(v: dict[str, float], name: str = "fit"):
    """A ``Profile`` with the fitted values ``v`` (what the cost model says with them)."""
    from liver.policy.profile import Profile

    return Profile(name=name, **v)


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
    """A rank's state on the new generation (GB), as the cost model counts it (``costs.rank_state_bytes``)."""
    from liver.policy import costs

    return costs.rank_state_bytes(e.job, costs.layout(e.job, e.new)) / GB


def fit(events: list[Event], steps: list[Step], direct: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """The profile's values, and where each came from."""
    v: dict[str, float] = {}
    src: dict[str, str] = {}
    for k, where in DIRECT.items():
        if k not in direct:
            raise ValueError(f"calibration: {k} needs bench/results/{where[0]}")
        v[k], src[k] = direct[k], where[1]
    for k, (val, why) in STATED.items():
        v[k], src[k] = val, why
    fit_handoffs(events, v, src)
    single = [s for s in steps if s.parallel.world_size == 1]
    if not single:
        raise ValueError("calibration: no measured one-GPU step gives the sustained share of the peak")
    # 1 / (6 N tokens / (peak x step time)) = 1 / mfu + (mfu_width / mfu) / width: linear in 1 / width
    inv, per_width = _nnls([[1.0, 1.0 / s.width] for s in single],
                           [s.peak_flops * s.step_s / (6 * s.params * s.tokens) for s in single])
    v["mfu"], v["mfu_width"] = 1.0 / inv, per_width / inv
    src["mfu"] = src["mfu_width"] = (
        "least squares (coefficients 0 or more) over one-GPU steps: 1 / (6 N tokens / (peak x step time)) "
        "against 1 / their hidden size (a share of the peak that grows with the matrix multiplies' width)")
    v["peak_flops"] = steps[0].peak_flops if steps else 989e12
    src["peak_flops"] = "the GPU's bf16 dense peak"
    return v, src


UNRESOLVED_BW = 1e30  # a rate the bytes do not resolve: no time per byte
UNRESOLVED = ("; where the bytes do not resolve a rate (a slope of 0 or less: small states, the fixed part "
              "dominates), the time is its fixed part, the mean, and the rate unbounded (1e30)")


def _fixed_and_rate(nbytes: list[float], times: list[float]) -> tuple[float, float]:
    """A fixed time and a rate (bytes/s) by least squares of ``times`` against ``nbytes``."""
    fixed, inv_bw = _lsq([[1.0, b] for b in nbytes], times)
    if inv_bw <= 0:
        return statistics.mean(times), UNRESOLVED_BW
    return max(0.0, fixed), 1 / inv_bw


def fit_handoffs(events: list[Event], v: dict[str, float], src: dict[str, str]) -> None:
    """The handoffs' and restarts' quantities fitted to ``events``, into ``v`` (which holds the
    direct measurements and stated settings they build on) with their sources in ``src``."""
    from liver.policy import costs

    # live and restart quantities from every run: what differs between the code versions they ran
    # (the companion share each preparation was paced at, the run's history of communicators) is modelled
    # where processes share cores (CPU processes: v["cores"]), each phase measured is its work times
    # the crowding of its processes (costs.crowding): the fit is of the work, each time over it
    works = {e: e.work for e in events}
    cores = v.get("cores")
    crowd = {e: costs.crowding(cores, max(e.old.world_size, e.new.world_size)) for e in events}  # a handoff's
    old_crowd = {e: costs.crowding(cores, e.old.world_size) for e in events}  # a restart's save
    new_crowd = {e: costs.crowding(cores, e.new.world_size) for e in events}  # ... and the rest of it
    rate = _median([works[e].io_bytes * crowd[e] / e.transfer_s for e in events
                    if not e.joiners and works[e].io_bytes and e.transfer_s > 0], "a transfer")
    how = ("the busiest process's bytes sent and received together (they share its copy engines and SMs: on a "
           "pair of H200s a TP2->DP2 exchange of 6.17 GB each way took 0.033 s, a TP2->TP1 scale-in's 6.17 GB one "
           "way 0.0195 s, bench/results/gpu-1b-live-vs-restart and gpu-1b-overhead-16-events: 1.7x, not the 1x "
           "of two independent directions nor quite the 2x counted) / the measured transfer time, median over the "
           "handoffs whose processes all survive")
    links = [e.link_bw for e in events if e.link_bw]
    if links:  # the link measured in the runs: the transfer moves at a share of it
        v["intra_bw"], v["transfer_share"] = statistics.median(links), rate / statistics.median(links)
        src["intra_bw"] = ("measured: a GPU's one-way sends to the other in each run before its handoffs (median "
                           "of the runs' p2p_GBps): the step's collectives' link (NVLink's published 450 GB/s "
                           "each way, 900 GB/s both)")
        src["transfer_share"] = how + ", over the link's measured one-way rate"
    else:  # gloo over loopback: no link measured apart from the transfers
        v["intra_bw"], v["transfer_share"] = rate, 1.0
        src["intra_bw"], src["transfer_share"] = how, "the transfers' own rate is the link's"
    v["connect_p2p_s"] = max(0.0, _median([e.transfer_s / crowd[e] - costs.transfer_s(works[e], rate, v["copy_bw"])
                                           for e in events if e.joiners and works[e].io_bytes], "a joiner's transfer"))
    src["connect_p2p_s"] = "median of a scale-out's transfer less its bytes' time (the model's, with the fitted link)"
    v["switch_fixed_s"], v["switch_s_per_gb"] = _nnls([[1.0, state_gb(e)] for e in events],
                                                      [(e.switch_s - e.transfer_s) / crowd[e] for e in events])
    src["switch_fixed_s"] = src["switch_s_per_gb"] = (
        "least squares (coefficients 0 or more): switch time less transfer time against a rank's new state (GB)")
    extra = _nnls([[1.0, float(bool(e.kinds & {"tp", "pp"})), float("dp" in e.kinds), float(e.first_nccl)]
                   for e in events], [(e.downtime_live_s - e.switch_s) / crowd[e] for e in events])
    v["first_step_s"], v["connect_tp_s"], v["connect_dp_s"], v["nccl_first_s"] = extra
    src["first_step_s"] = src["connect_tp_s"] = src["connect_dp_s"] = src["nccl_first_s"] = (
        "least squares (coefficients 0 or more): downtime less switch time (the boundary and the first step "
        "beyond a normal one) against the kinds of collective the first step runs over a new process set (the "
        "run's history: results.replay) and whether they are its processes' first NCCL collectives")
    grouped = [e for e in events if e.new.world_size > 1]
    v["group_init_s"] = _median([e.init_s / new_crowd[e] - v["rendezvous_s_per_rank"] * e.new.world_size
                                 for e in grouped],
                                "a restart's groups")
    src["group_init_s"] = ("median of a restart's group set-up less its rendezvous (2 ranks): new processes' "
                           "communicators, as a live handoff's joiners build theirs")
    joining = [e for e in events if e.joiners]
    v["mock_s_per_gparam"] = _median([e.mock_s / (e.params / e.new.world_size / 1e9) for e in joining], "a mock warm-up")
    src["mock_s_per_gparam"] = "median of a joiner's mock warm-up per billion parameters it holds"
    rows, ys = [], []
    for e in events:
        unpaced = v["plan_s_per_krank"] * max(e.old.world_size, e.new.world_size) / 1000 + (
            v["joiner_boot_s"] + e.mock_s + v["group_init_s"] if e.joiners else costs.SHARED_GROUPS_S)
        rows.append([float(not e.joiners), float(e.joiners), works[e].tasks / e.share])
        ys.append((e.prepare_s - unpaced) / crowd[e])
    v["prepare_base_s"], v["prepare_joiner_s"], v["prepare_cpu_s_per_task"] = _nnls(rows, ys)
    src["prepare_base_s"] = src["prepare_joiner_s"] = src["prepare_cpu_s_per_task"] = (
        "least squares (coefficients 0 or more): a handoff's preparation less its plan, groups (and a joiner's "
        "boot and mock warm-up) against the busiest process's transfer tasks over the companion share it was "
        "paced at (the paced CPU work per task), with a part of its own for handoffs with joiners")
    v["prepare_stall_s"] = _median([e.stall_s for e in events if not e.joiners], "a preparation's stall")
    v["prepare_stall_joiner_s"] = _median([e.stall_s for e in joining], "a preparation's stall with joiners")
    src["prepare_stall_s"] = src["prepare_stall_joiner_s"] = (
        "median of the training time a handoff's preparation stalled (its steps beyond their normal time, measured "
        "per event), without joiners and with them")
    dcp = [costs.dcp_bytes(e.job, e.old, e.new) for e in events]
    v["save_fixed_s"], v["save_bw_per_rank"] = _fixed_and_rate([w for w, _, _ in dcp],
                                                               [e.save_s / old_crowd[e] for e in events])
    src["save_fixed_s"] = src["save_bw_per_rank"] = \
        "least squares: save time against the busiest rank's bytes written (DCP, replicas deduplicated)" + UNRESOLVED
    v["load_fixed_s"], v["load_bw_per_rank"] = _fixed_and_rate([r for _, r, _ in dcp],
                                                               [e.load_s / new_crowd[e] for e in events])
    src["load_fixed_s"] = src["load_bw_per_rank"] = (
        "least squares: load time (with the model's build) against the busiest rank's bytes read (DCP reads "
        "every saved chunk that overlaps a rank's shard whole: costs.dcp_bytes)" + UNRESOLVED)
    fresh = [e for e in events if e.fresh]
    v["process_start_s"] = _median([e.start_s / new_crowd[e]
                                    / (1 + v.get("host_start_growth", 0.0) * max(0, min(v["node_size"], e.new.world_size) - 2))
                                    for e in fresh], "a fresh process start")
    src["process_start_s"] = "median of the restart's process start (fresh interpreters: imports, CUDA)"
    rest = [(e.downtime_restart_s - e.save_s - e.load_s - e.start_s - e.init_s) / new_crowd[e] for e in events]
    v["restart_fixed_s"], v["restart_s_per_gb"] = _nnls([[1.0, state_gb(e)] for e in events], rest)
    src["restart_fixed_s"] = src["restart_s_per_gb"] = (
        "least squares (coefficients 0 or more): the restart downtime less its save, load, start and group "
        "parts against a new rank's state (GB)")


# ---- CPU processes: the controller's target choice on this machine ---------------------------
CPU_TERMS = ("compute_s_per_flop", "layer_op_s", "tp_latency_s", "dp_latency_s", "p2p_latency_s", "step_fixed_s")
CPU_CORES = 2  # the machine the target benchmark ran on (bench/results/cpu-target-choice)


def _cpu_features(job, lay, cores: int) -> list[float]:
    """The step-time model's terms for CPU processes (``costs.step_time``), each with a unit
    coefficient: the fit finds the coefficients."""
    from liver.policy import costs

    m, t = job.facts, job.train
    micro = lay.num_micro_batches
    stage = costs.paced_layers(lay, cores)
    path = (micro + lay.pp - 1) * stage
    share = costs.crowding(cores, lay.size)
    compute = (6 * m.params * t.global_batch * m.seq_len / min(lay.size, cores) * (micro + lay.pp - 1) / micro
               * costs.pace(lay, cores))
    return [compute, share * path, share * 4 * path * (lay.tp - 1), share * (lay.dp - 1) * (stage + 2),
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


def fit_cpu(samples) -> tuple[dict[str, float], dict[str, str]]:
    from liver.topology.presets import target_shape as job_of

    xs = [_cpu_features(Workload.reference(job_of(shape)), lay, CPU_CORES) for shape, _, lay, _ in samples]
    coef = _nnls(xs, [t for *_, t in samples])
    v = dict(zip(CPU_TERMS, coef))
    per_flop = v.pop("compute_s_per_flop")
    values = {"cores": CPU_CORES, "peak_flops": 1.0 / per_flop if per_flop > 0 else 1e30, "mfu": 1.0,
              "mfu_width": 0.0, "cuda_context_s": 0.0, **v}
    why = (f"relative least squares (coefficients 0 or more) over {len(samples)} configurations timed by "
           "liver bench target (bench/results/cpu-target-choice)")
    return values, {k: why for k in values} | {"cores": "the CPU machine's cores", "mfu": "folded into peak_flops",
                                               "mfu_width": "folded into peak_flops",
                                               "cuda_context_s": "no CUDA in CPU processes"}


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
        handoffs = cpu_events(results)
        if handoffs:  # the CPU processes' own handoffs and restarts (gloo over loopback)
            hv, hs = cpu_handoffs({**values, **cv}, {**sources, **cs}, handoffs)
            cv, cs = {**cv, **hv}, {**cs, **hs}
        out["profiles"]["cpu"] = {"values": cv, "sources": cs,
                                  **({"measured_events": [e.source for e in handoffs]} if handoffs else {})}
    return out


def cpu_handoffs(values: dict[str, float], sources: dict[str, str],
                 events: list[Event]) -> tuple[dict[str, float], dict[str, str]]:
    """``HANDOFF_KEYS`` fitted to CPU ``events`` (the rest as ``values`` holds them: the direct
    measurements and stated settings the fit builds on), with their sources."""
    v, src = dict(values), dict(sources)
    fit_handoffs(events, v, src)
    where = f"; over {len(events)} handoffs on CPU processes (bench/results/{CPU_HANDOFFS})"
    return {k: v[k] for k in HANDOFF_KEYS}, {k: src[k] + where for k in HANDOFF_KEYS}


def write(results: Path, out: Path = CALIBRATION) -> dict[str, Any]:
    data = calibrate(results)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


#: a refit on another machine may differ in the last bits of a least-squares solution (its BLAS,
#: its summation order): numbers agree to this relative tolerance, everything else exactly
FIT_RTOL = 1e-9


def same_fit(a: Any, b: Any, rtol: float = FIT_RTOL) -> bool:
    """Two calibrations alike: the same structure and text, numbers within ``rtol`` of each other."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-300)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_fit(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_fit(x, y, rtol) for x, y in zip(a, b))
    return a == b


def check(results: Path, out: Path = CALIBRATION) -> bool:
    """The committed file is what the measurements give (a reproducible fit, to ``FIT_RTOL``)."""
    have = json.loads(out.read_text())
    want = json.loads(json.dumps(calibrate(results), sort_keys=True))
    return same_fit(have, want)
