"""What bench/results holds, read for the simulator: each measured handoff as an ``Event`` (live
and restart side by side), each step time as a ``Step``, and the direct measurements (``DIRECT``:
the file each comes from, and what it says). ``calibrate`` fits a profile to them, ``validate``
checks the fit on those it did not see.

- ``measurements(results)``: the H200 runs' handoffs (``*/gpu_reconfig.json`` with live and
  restart events), the step times of their reports, and the direct measurements;
- ``held_out(results)``: the live-only runs' handoffs (never in a fit);
- ``cpu_events`` / ``cpu_reconfig_events``: the CPU runs of ``liver bench handoffs --backend gloo``
  and of ``liver bench reconfig``;
- ``cpu_samples(path)``: the CPU step times ``liver bench target`` timed.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liver.policy.outcome import Outcome, outcome_of
from liver.policy.workload import Workload
from liver.topology import ParallelConfig

PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A800": 312e12}
# measured directly: the file under bench/results, and what it says
DIRECT = {
    "plan_s_per_krank": ("cpu-planner-speed/plan.json",
                         "measured: the planner on GPT-3 175B at 1,024 to 2,048 ranks, per 1,000 ranks"),
    "joiner_boot_s": ("cpu-joiner-boot/boot.json", "measured: a joiner forked from the zygote, before its mock world (CPU)"),
    "dp_kill_stall_s": ("cpu-heal-vs-torchft/side_by_side.json",
                        "measured: torchft 0.2.0, a replica SIGKILLed, the survivor's stall and uncommitted step "
                        "(median; CPU machine, torchft's default heartbeats)"),
    "copy_bw": ("gpu-1x-sim-copy/dcp.json", "measured: a 1 GiB copy within one H200's memory (liver bench dcp)"),
    "host_bw": ("gpu-1x-host-copy/host_copy.json",
                "measured: one H200's 1 GiB copies to and from pinned host memory, the slower way (liver bench "
                "host-copy)"),
    "host_read_bw": ("gpu-1x-host-start/host_start.json",
                     "measured: the most processes of one host reading a 512 MiB shard each together (page cache "
                     "evicted), the slowest one's rate times their count (liver bench host-start; the lent H200 "
                     "machine's root disk)"),
    "host_start_growth": ("gpu-1x-host-start/host_start.json",
                          "measured: the slowest of the most processes started together (imports and CUDA context; "
                          "they shared one GPU: an upper bound) against two, per process beyond two "
                          "(liver bench host-start, H200 machine)"),
    "rendezvous_s_per_rank": ("gpu-1x-rendezvous/rendezvous.json",
                              "measured: N ranks' rendezvous through one TCPStore on loopback (connect, publish, count "
                              "in, wait, read rank 0's key), N = 8 to 512, the least-squares time per rank (liver bench "
                              "rendezvous, the lent H200 machine, torch 2.11); the store's network hop not included"),
    "cuda_context_s": ("gpu-1x-host-start/host_start.json",
                       "measured: one process's CUDA context after its imports (liver bench host-start, H200)"),
    "dp_join_stall_s": ("cpu-heal-vs-torchft/join.json",
                        "measured: torchft 0.2.0, a replica joins, the other's stall (median; CPU machine; its "
                        "0.15 GB of state sent over loopback included)"),
}


@dataclass(frozen=True)
class Event:
    """One measured handoff, with its restart counterpart."""

    source: str
    kind: str
    model: str             # the preset the run trained (liver.topology.presets)
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
    stall_s: float = 0.0   # training time its preparation stalled (steps beyond their normal time)
    kinds: frozenset[str] = frozenset()  # the collectives its first step ran over a new process set
    first_nccl: bool = False             # ... and whether they were the processes' first NCCL ones
    share: float = 0.0015                # the companion share its preparation was paced at
    link_bw: float | None = None         # the GPUs' link one way, measured in the run before its handoffs

    @property
    def joiners(self) -> bool:
        return self.new.world_size > self.old.world_size

    @property
    def work(self):
        """What its plan asks of the busiest processes (``costs.plan_work``): a measured scale-in
        named no node, so its leaving ranks were the controller's choice."""
        from liver.policy import costs

        return costs.plan_work(self.job, self.old, self.new, chosen_leaving=self.kind == "scale-in")

    @property
    def job(self) -> Workload:
        """The measured run's job as the reference engine trains it (the cost model's subject)."""
        from liver.topology.presets import PRESETS

        return Workload.reference(PRESETS[self.model])


@dataclass(frozen=True)
class Step:
    source: str
    model: str
    params: int
    tokens: int
    parallel: ParallelConfig
    step_s: float
    peak_flops: float

    @property
    def width(self) -> float:
        """A TP rank's share of the hidden size: the width of its matrix multiplies."""
        from liver.topology.presets import PRESETS

        return Workload.reference(PRESETS[self.model]).facts.width / self.parallel.tp


def parallel_of(text: str) -> ParallelConfig:
    """``tp2pp1dp1`` as the reports write it."""
    t, rest = text[2:].split("pp")
    p, d = rest.split("dp")
    return ParallelConfig(tp=int(t), pp=int(p), dp=int(d))


# the companion share of the runs that did not record theirs: the runtime's default at the commit
# each ran at (claims.toml); a run since records its own (gpu_reconfig.json "companion_share")
SHARES = {"gpu-1b-live-vs-restart": 0.0015, "gpu-3b-live-vs-restart": 0.0025, "gpu-1b-restart-forked": 0.005,
          "gpu-1b-overhead-16-events": 0.0025}


def _share(f: Path, d: dict[str, Any]) -> float:
    share = d.get("companion_share", SHARES.get(f.parent.name))
    if share is None:
        raise ValueError(f"{f}: companion_share missing, and {f.parent.name!r} is not a run whose share is "
                         f"known (results.SHARES: {', '.join(SHARES)})")
    return share


def _preset(f: Path, d: dict[str, Any]) -> str:
    """The preset a run trained: named, or the one with its parameter count."""
    from liver.topology.presets import PRESETS

    if d.get("model") in PRESETS:
        return d["model"]
    match = [k for k, job in PRESETS.items() if Workload.reference(job).facts.params == d.get("params")]
    if not match:
        raise ValueError(f"{f}: model={d.get('model')!r}, params={d.get('params')!r}: allowed a preset "
                         f"({', '.join(PRESETS)}) or its parameter count")
    return match[0]


def replay(model: "str | Workload", run: list[tuple[ParallelConfig, ParallelConfig]]) -> list[tuple[frozenset[str], bool]]:
    """For each handoff of a run, in order: the kinds of collective its first step ran over a
    process set that had not run them in this run (``costs.first_uses`` with the run's history: a
    communicator keeps its connections across the generations that share it), and whether its
    processes had run any NCCL collective before. Survivors keep their ranks, the last ranks
    leave, joiners are new processes after them. ``model``: a preset's name (the reference
    engine's job) or the job as its engine trains it."""
    from liver.policy import costs
    from liver.topology.presets import PRESETS

    job = Workload.reference(PRESETS[model]) if isinstance(model, str) else model
    procs = list(range(run[0][0].world_size)) if run else []
    fresh_id = len(procs)
    ran: dict[str, set[frozenset[int]]] = {k: set() for k in costs.KINDS}

    def sets(par: ParallelConfig, ids: list[int]) -> dict[str, set[frozenset[int]]]:
        groups = costs.collective_groups(costs.layout(job, par))
        return {k: {frozenset(ids[r] for r in g) for g in v} for k, v in groups.items()}

    for k, v in sets(run[0][0], procs).items() if run else ():
        ran[k] |= v
    used = bool(run) and run[0][0].world_size > 1
    out = []
    for _, new in run:
        procs = procs[:new.world_size] + list(range(fresh_id, fresh_id + max(0, new.world_size - len(procs))))
        fresh_id = max(fresh_id, max(procs, default=-1) + 1)
        now = sets(new, procs)
        kinds = frozenset(k for k in costs.KINDS if now[k] - ran[k])
        out.append((kinds, not used and new.world_size > 1))
        for k, v in now.items():
            ran[k] |= v
        used = used or new.world_size > 1
    return out


#: CPU runs of ``liver bench handoffs --backend gloo``: the CPU profile's handoffs and restarts
CPU_HANDOFFS = "cpu-handoffs-*/handoffs.json"



def _events(f: Path, d: dict[str, Any]) -> list[Event]:
    """The handoffs of one run (``gpu_reconfig.json`` or ``handoffs.json``), live and restart."""
    fresh = "forked" not in f.parent.name
    model = _preset(f, d)
    history = replay(model, [(parallel_of(e["old"]), parallel_of(e["new"])) for e in d["events"]])
    events = []
    for e, (kinds, first_nccl) in zip(d["events"], history):
        events.append(Event(source=f"{f.parent.name}:{e['event']}:{e['old']}->{e['new']}", kind=e["event"],
                            model=model, kinds=kinds, first_nccl=first_nccl and bool(d.get("gpus")), share=_share(f, d),
                            params=d["params"], old=parallel_of(e["old"]), new=parallel_of(e["new"]),
                            downtime_live_s=e["downtime_live_s"], transfer_s=e["transfer_s"], switch_s=e["switch_s"],
                            prepare_s=e["prepare_s"], groups_s=e["groups_s"], mock_s=e["mock_warmup_s"],
                            max_rank_bytes=e["max_rank_bytes"], downtime_restart_s=e["downtime_restart_s"],
                            save_s=e["restart_save_s"], load_s=e["restart_load_s"],
                            start_s=e["restart_process_start_s"], init_s=e["restart_group_init_s"], fresh=fresh,
                            stall_s=e.get("prepare_stall_s") or 0.0,
                            link_bw=d["p2p_GBps"] * 1e9 if d.get("p2p_GBps") else None))
    return events


def cpu_events(results: Path) -> list[Event]:
    """The handoffs measured on CPU processes (``CPU_HANDOFFS``)."""
    out = []
    for f in sorted(results.glob(CPU_HANDOFFS)):
        d = json.loads(f.read_text())
        if d.get("events") and "downtime_restart_s" in d["events"][0]:
            out += _events(f, d)
    return out


#: CPU runs of ``liver bench reconfig --json`` (the reference engine's tiny job): never in a fit,
#: the CPU profile predicts them (``validate.validate_cpu_reconfig``)
CPU_RECONFIG = "cpu-*/reconfig.json"
RECONFIG_SHARE = 0.0015  # the runtime's companion share where a row does not record its own (before it did)


def cpu_reconfig_events(results: Path) -> list[Event]:
    """The scenarios of the CPU runs of ``liver bench reconfig`` (``CPU_RECONFIG``) on the reference
    engine's tiny job, one event each: its live downtime, transfer and preparation the medians over
    its live events, its restart downtime the median of its restarts (fresh interpreters). What the
    bench does not record (the switch, the groups, the restart's parts) is NaN. Rows of another
    workload, or of a bench that did not yet name its workload, are left out."""
    from liver.topology.presets import PRESETS

    nan = float("nan")
    out = []
    for f in sorted(results.glob(CPU_RECONFIG)):
        for r in json.loads(f.read_text()):
            if not isinstance(r, dict) or r.get("workload") != "reference tiny":
                continue
            action = r["event"].split()
            new = action[action.index("as") + 1] if "as" in action else action[1]
            old, new = ParallelConfig.parse(r["first"]), ParallelConfig.parse(new)
            (kinds, _), = replay("tiny", [(old, new)])
            out.append(Event(source=f"{f.parent.name}:{action[0]}:{old.short()}->{new.short()}", kind=action[0],
                             model="tiny", kinds=kinds, share=r.get("companion_share", RECONFIG_SHARE),
                             params=Workload.reference(PRESETS["tiny"]).facts.params, old=old, new=new,
                             downtime_live_s=r["downtime_live_s"], transfer_s=r["transfer_s"], switch_s=nan,
                             prepare_s=r["prepare_s"], groups_s=nan, mock_s=nan, max_rank_bytes=0,
                             downtime_restart_s=r["downtime_restart_s"], save_s=nan, load_s=nan, start_s=nan,
                             init_s=nan, fresh=True))
    return out


def measurements(results: Path) -> tuple[list[Event], list[Step], dict[str, float]]:
    """Every measured event and step of ``results`` (bench/results), and the direct measurements."""
    events, steps, direct = [], [], {}
    for f in sorted(results.glob("*/gpu_reconfig.json")):
        d = json.loads(f.read_text())
        if not d.get("events") or "downtime_restart_s" not in d["events"][0] or not d.get("gpus"):
            continue
        events += _events(f, d)
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
                    steps.append(Step(f.parent.name, _preset(f, d), d["params"], tokens, parallel_of(par), statistics.median(ts[2:]),
                                      peak))
    plan = results / DIRECT["plan_s_per_krank"][0]
    if plan.exists():
        rows = json.loads(plan.read_text())
        direct["plan_s_per_krank"] = statistics.median(r["plan_s"] / (max(r["ranks_old"], r["ranks_new"]) / 1000)
                                                       for r in rows)
    for key in ("dp_kill_stall_s", "dp_join_stall_s"):
        f = results / DIRECT[key][0]
        if f.exists():  # torchft's replicas: the median time the ones that stay lose to the event
            direct[key] = json.loads(f.read_text())["torchft"]["total_lost_s"]
    copy = results / DIRECT["copy_bw"][0]
    if copy.exists():
        direct["copy_bw"] = json.loads(copy.read_text())["local_copy_GBps"] * 1e9
    hc = results / DIRECT["host_bw"][0]
    if hc.exists():  # (a restart's save goes down, its load up: one way at a time)
        row = next(r for r in json.loads(hc.read_text())["rows"] if r["mib"] == 1024)
        direct["host_bw"] = min(row["h2d_GBps"], row["d2h_GBps"]) * 1e9
    hs = results / DIRECT["host_read_bw"][0]
    if hs.exists():  # (the slowest process of each count, median over the runs)
        d = json.loads(hs.read_text())
        rows = {r["procs"]: r for r in d["rows"]}
        most, two = max(rows), rows.get(2, rows[min(rows)])
        direct["host_read_bw"] = most * d["read_mib_per_process"] * 2 ** 20 / rows[most]["read_s"]
        start = {k: r["import_s"] + r["cuda_s"] for k, r in rows.items()}
        direct["host_start_growth"] = max(0.0, start[most] / (two["import_s"] + two["cuda_s"]) - 1) / (most - 2) \
            if most > 2 else 0.0
        direct["cuda_context_s"] = rows[min(rows)]["cuda_s"]
    rv = results / DIRECT["rendezvous_s_per_rank"][0]
    if rv.exists():
        direct["rendezvous_s_per_rank"] = json.loads(rv.read_text())["s_per_rank"]
    boot = results / DIRECT["joiner_boot_s"][0]
    if boot.exists():
        rows = json.loads(boot.read_text())
        direct["joiner_boot_s"] = next(r["wall_s"] for r in rows if r["start"] != "fresh interpreter")
    return events, steps, direct


def held_out(results: Path) -> list[Event]:
    """The live-only runs' handoffs (no restart beside them: ``--live-only``), from their reports:
    not in the fit, the simulator predicts them (``validate_held_out``)."""
    events = []
    nan = float("nan")
    for f in sorted(results.glob("*/gpu_reconfig.json")):
        d = json.loads(f.read_text())
        rep = f.parent / "report-live.json"
        if not d.get("live_only") or not d.get("gpus") or not rep.exists():
            continue
        model = _preset(f, d)
        recs = [e for e in json.loads(rep.read_text())["events"] if outcome_of(e) is Outcome.DONE]
        history = replay(model, [(parallel_of(e["old"]), parallel_of(e["new"])) for e in recs])
        for e, (kinds, first_nccl) in zip(recs, history):
            events.append(Event(source=f"{f.parent.name}:{e['event']['kind']}:{e['old']}->{e['new']}",
                                kind=e["event"]["kind"], model=model, kinds=kinds, first_nccl=first_nccl,
                                share=_share(f, d), params=d["params"], old=parallel_of(e["old"]), new=parallel_of(e["new"]),
                                downtime_live_s=e["downtime_s"], transfer_s=e["transfer_s"], switch_s=e["switch_s"],
                                prepare_s=e["prepare_s"], groups_s=e["groups_s"], mock_s=e["mock_warmup_s"] or 0.0,
                                max_rank_bytes=max(e["max_rank_bytes_in"], e["max_rank_bytes_out"]),
                                downtime_restart_s=nan, save_s=nan, load_s=nan, start_s=nan, init_s=nan, fresh=True))
    return events


def cpu_samples(path: Path) -> list[tuple[str, int, Any, float]]:
    """(shape, processes, layout, measured step time) of ``liver bench target``'s JSON."""
    from liver.topology.presets import target_shape as job_of
    from liver.policy.costs import layout

    out = []
    for r in json.loads(path.read_text())["rows"]:
        job = Workload.reference(job_of(r["shape"]))
        for par, t in r["measured_step_s"].items():
            out.append((r["shape"], r["processes"], layout(job, parallel_of(par)), t))
    return out
