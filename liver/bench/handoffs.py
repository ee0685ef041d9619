"""``liver bench handoffs``: a scenario of events applied live and by stop-and-restart through DCP,
side by side in one call, on any backend (the GPU runs use NCCL, one process per GPU; on CPU with
gloo it is a dry run of the same script). The restart run gets the same events cut at the steps
where the live run switched, so both train the same steps in the same layouts. On NCCL the
point-to-point bandwidth is measured first in the same call (the transfer floor).

    liver bench handoffs --scenario x2-twice --model 1b --run-root /dev/shm --out OUT
    liver bench handoffs --scenario x2-cycles --cycles 4 --gap 40 --live-only --model 1b --out OUT
    liver bench handoffs --scenario x8 --model tiny8 --backend gloo --out OUT      # CPU dry run
    liver bench handoffs --scenario x2-native --model 1b --engine examples/llama.py:RECIPE \
        --set job.model.vocab_size=50304 --out OUT     # (the example's TP needs the vocabulary even)
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from liver.bench.scenarios import Scenario
from liver.config.jobfile import build, override
from liver.controller import report as rep
from liver.policy.events import parse_schedule_text
from liver.controller.job import run_job
from liver.engine.interface import absolute_engine_path
from liver.topology.presets import PRESETS


_X2 = (("scale-out 2 as 2,1,1", 8), ("reshape 1,1,2", 45), ("scale-in 1 deadline 60s as 1,1,1", 60))
_CYCLE = ("reshape 1,1,2", "reshape 2,1,1", "scale-in 1 deadline 60s as 1,1,1", "scale-out 2 as 2,1,1")

# name -> the scenario for (cycles, gap); the GPUs at the start and the slots follow from it
SCENARIOS = {
    "x2": lambda c, g: Scenario("x2", "1,1,1", _X2),
    "x2-twice": lambda c, g: Scenario("x2-twice", "1,1,1", _X2 + (("scale-out 2 as 2,1,1", 75), ("reshape 1,1,2", 110),
                                                                  ("scale-in 1 deadline 60s as 1,1,1", 125))),
    # a user's DTensor model: TP2 on a cold joiner, TP2 -> FSDP2, FSDP2 -> TP2, scale-in by deadline
    "x2-native": lambda c, g: Scenario("x2-native", "1,1,1", (("scale-out 2 as 2,1,1", 8), ("reshape 1,1,2", 45),
                                                              ("reshape 2,1,1", 60),
                                                              ("scale-in 1 deadline 60s as 1,1,1", 75))),
    "x2-cycles": lambda c, g: Scenario("x2-cycles", "2,1,1", tuple((a, 10 + g * i) for i, a in enumerate(_CYCLE * c))),
    "x8": lambda c, g: Scenario("x8", "4,2,1", (("reshape 8,1,1", 8), ("reshape 2,2,2", 20),
                                                ("scale-in 4 deadline 120s as 2,2,1", 32),
                                                ("scale-out 8 as 2,2,2", 44), ("reshape 4,1,2", 80))),
}


def _p2p(rank: int, addr: str, out: str) -> None:
    import torch

    from liver.bench.p2p import p2p_bandwidth
    from liver.world.group import Group
    from liver.world.world import connect_store

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    g = Group.create(connect_store(addr), "p2p", [0, 1], rank, "nccl", dev, timedelta(seconds=120))
    g.connect()
    bw = p2p_bandwidth(g, 1 - rank, rank == 0, dev)
    if rank == 0:
        Path(out).write_text(json.dumps({"p2p_GBps": bw}))
    g.destroy()


def measure_p2p(out: Path) -> float:
    from liver.world.world import make_store
    _, addr = make_store()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_p2p, args=(r, addr, str(out / "p2p.json"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return json.loads((out / "p2p.json").read_text())["p2p_GBps"]


def job_layers(args) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job of ``--model``, ``--engine`` and ``--set section.field=value`` (a user's model's
    shape beyond the preset): the base table, and the overrides to put over the bench's own."""
    base = {"preset": args.model, **({"engine": absolute_engine_path(args.engine)} if args.engine else {})}
    return base, [override(t) for t in getattr(args, "set", None) or ()]


def _simulated(cfg, backend: str, events: list[dict[str, Any]]) -> list[dict[str, float] | None]:
    """The simulator's figures beside each handoff the live run made (``validate.beside``: the
    profile of its backend, its companion share, its history), None for one it did not make."""
    from liver.policy.workload import Workload
    from liver.sim.results import parallel_of
    from liver.sim.validate import beside

    done = [(i, parallel_of(e["old"]), parallel_of(e["new"])) for i, e in enumerate(events)
            if e.get("old") and e.get("new")]
    figures = beside(Workload(cfg.adapter, cfg.job), [(o, n) for _, o, n in done],
                     "h200" if backend == "nccl" else "cpu", cfg.prepare.companion_share, backend == "nccl")
    out: list[dict[str, float] | None] = [None] * len(events)
    for (i, _, _), f in zip(done, figures):
        out[i] = f
    return out


def _run(mode: str, schedule: str, steps: int, end_after: int | None, args, first: str, gpus: int, slots: int,
         out: Path) -> dict[str, Any]:
    d = Path(args.run_root or out) / f"run-{mode}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "events.txt").write_text(schedule)
    base, sets = job_layers(args)
    cfg = build(base, {"steps": steps, "gpus": gpus, "parallel": first, "backend": args.backend,
                 "digest": "switch", "checkpoint": {"every": 0}, "transfer": {"budget_mib": args.budget_mib},
                 "prepare": {"mock_steps": 2, "group_timeout_s": 300.0, "connect": args.connect},
                 "agent": {"slots": slots, "quiet": True},
                 "controller": {"mode": mode, "endpoint": False, "end_after_events": end_after}},
                *sets)
    report = run_job(cfg, parse_schedule_text(schedule, str(d / "events.txt")), d, {"model": args.model})
    print(rep.summary(report), flush=True)
    shutil.copy(d / "timeline.png", out / f"timeline-{mode}.png")
    shutil.copy(d / "report.json", out / f"report-{mode}.json")
    return report


def run(args) -> dict[str, Any]:
    """The whole experiment; writes OUT/handoffs.json and returns it."""
    if args.scenario not in SCENARIOS:
        raise ValueError(f"--scenario={args.scenario!r}: allowed {', '.join(SCENARIOS)}")
    if args.model not in PRESETS:
        raise ValueError(f"--model={args.model!r}: allowed {', '.join(PRESETS)}")
    base, sets = job_layers(args)
    cfg = build(base, *sets)  # (ValueError naming the field: engine=, job.model..., before anything runs)
    job = cfg.job
    if args.cycles < 1 or args.gap < 1:
        raise ValueError(f"--cycles={args.cycles}, --gap={args.gap}: allowed positive counts")
    import torch

    sc = SCENARIOS[args.scenario](args.cycles, args.gap)
    first, gpus, slots = sc.first, sc.gpus, sc.slots
    if args.backend == "nccl" and torch.cuda.device_count() < slots:
        raise ValueError(f"--scenario={args.scenario} on nccl needs {slots} GPUs; this machine has "
                         f"{torch.cuda.device_count()} (--backend gloo: a CPU dry run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    info = {"torch": torch.__version__, "model": args.model, "engine": args.engine or "reference",
            "scenario": args.scenario, "connect": args.connect,
            "companion_share": cfg.prepare.companion_share,  # what the preparation was paced at (liver sim)
            "backend": args.backend, "params": cfg.adapter.facts(job).params,
            "set": list(getattr(args, "set", None) or ()),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}
    bw = info["p2p_GBps"] = measure_p2p(out) if args.backend == "nccl" else None
    live = _run("live", sc.schedule(), 5000, 8, args, first, gpus, slots, out)
    cuts = [e.get("last_old_step") for e in live["events"]]
    by_kind = {}
    for kind in dict.fromkeys(e["event"]["kind"] for e in live["events"]):
        pooled = rep.pooled_overhead(live["steps"], [e for e in live["events"] if e["event"]["kind"] == kind])
        by_kind[kind] = {k: v for k, v in pooled.items() if not k.endswith("windows")}
    result: dict[str, Any] = {**info, "steady_overhead_by_kind": by_kind, "wall_live_s": live["wall_s"],
                              "digests_equal": all(e.get("digest_equal") for e in live["events"])}
    sim = _simulated(cfg, args.backend, live["events"])
    if any(c is None for c in cuts) or args.live_only:
        keys = ("old", "new", "outcome", "status", "downtime_s", "transfer_s", "prepare_s", "prepare_cpu_s", "joiner_cpu_s",
                "steady_overhead", "steps_preparing", "digest_equal", "deadline_met", "peak_extra_bytes")
        result.update(live_only=True, events=[{"event": e["event"]["kind"], **{k: e.get(k) for k in keys},
                                               "simulated": s} for e, s in zip(live["events"], sim)])
        (out / "handoffs.json").write_text(json.dumps(result, indent=1))
        return result
    restart = _run("restart", sc.schedule(cuts),
                   live["steps"][-1]["step"], None, args, first, gpus, slots, out)
    rows = []
    for el, er in zip(live["events"], restart["events"]):
        peak = max(el["max_rank_bytes_in"], el["max_rank_bytes_out"])
        floor = peak / (bw * 1e9) if bw else None
        rows.append({"event": el["event"]["kind"], "old": el["old"], "new": el["new"],
                     "downtime_live_s": el.get("downtime_s"), "downtime_restart_s": er.get("downtime_s"),
                     "ratio": er["downtime_s"] / el["downtime_s"] if el.get("downtime_s") else None,
                     "transfer_s": el.get("transfer_s"), "switch_s": el.get("switch_s"), "transfer_floor_s": floor,
                     "bytes_moved": el.get("bytes_moved"), "max_rank_bytes": peak, "prepare_s": el.get("prepare_s"),
                     "steady_overhead": el.get("steady_overhead"), "steps_preparing": el.get("steps_preparing"),
                     # the preparation's parts (the simulator's calibration fits them: liver sim calibrate)
                     "groups_s": el.get("groups_s"), "mock_warmup_s": el.get("mock_warmup_s") or 0.0,
                     "joiner_cpu_s": el.get("joiner_cpu_s"), "prepare_cpu_s": el.get("prepare_cpu_s"),
                     "prepare_stall_s": el.get("prepare_stall_s"),
                     "peak_extra_gpu_bytes": el.get("peak_extra_bytes"),
                     "digest_equal_live": el.get("digest_equal"), "digest_equal_restart": er.get("digest_equal"),
                     "restart_save_s": er.get("save_s"), "restart_load_s": er.get("load_s"),
                     "restart_process_start_s": er.get("process_start_s"), "restart_group_init_s": er.get("group_init_s"),
                     "deadline_met_live": el.get("deadline_met"),
                     "last_old_step": el.get("last_old_step"), "simulated": sim[len(rows)]})
    # on GPUs the losses differ from step 2 on in both modes alike (non-deterministic kernels); the
    # handoffs' bit-exactness is the digest equality per event
    result.update(events=rows, wall_restart_s=restart["wall_s"],
                  losses_live_equal_restart=[(s["step"], s["parallel"], s["loss"]) for s in live["steps"]] ==
                  [(s["step"], s["parallel"], s["loss"]) for s in restart["steps"]])
    (out / "handoffs.json").write_text(json.dumps(result, indent=1))
    return result
