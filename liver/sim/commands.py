"""The ``liver sim ...`` commands and ``liver bench sim-speed`` (registered by ``add_parsers``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


DEFAULT_TRACES = Path(__file__).resolve().parent.parent.parent / "traces" / "bamboo"  # (the repository's copy)


def _simulator():
    """The discrete-event engine and its sources; SimPy is the simulator's extra (``liver[sim]``)."""
    try:
        from liver.sim import engine, sources
    except ModuleNotFoundError as e:
        raise ValueError(f"liver sim needs {e.name}, which is not installed: pip install 'liver[sim]'") from None
    return engine, sources


def _print_rows(rows: list[dict], as_json: bool, line) -> int:
    print(json.dumps(rows, indent=1) if as_json else "\n".join(line(r) for r in rows))
    return 0


def _run(args: argparse.Namespace) -> int:
    engine, sources = _simulator()
    from liver.sim.models import sim_model
    from liver.policy.profile import load

    job, prof = sim_model(args.model), load(args.profile)
    sources.check("--hours", args.hours)
    sources.check("--notice-s", args.notice_s, zero=True)
    sources.check("--interval-min", args.interval_min)
    if args.trace:
        start, changes = sources.from_trace(args.trace, args.gpus_per_node, notice_s=args.notice_s, hours=args.hours)
    elif args.events:
        start, changes = args.gpus, sources.from_schedule(args.events, args.gpus)
    else:
        start = args.gpus
        changes = sources.synthetic(args.gpus, prof.node_size, args.interval_min * 60, args.notice_s, args.hours,
                                    seed=args.seed)
    from liver.engine.reference import ADAPTER
    from liver.policy import target
    from liver.sim import losses

    takes = losses.named(args.takes, args.seed)
    most = max([start, *(c.gpus for c in changes)])
    if target.best_up_to(ADAPTER, job, most, target.Hardware.of(prof)) is None:
        raise ValueError(f"--model {args.model}: no configuration of it fits on {most} GPUs of {args.profile} "
                         f"({prof.memory_bytes / 1e9:.0f} GB each), the most the run ever has: it would idle "
                         f"throughout; allowed a smaller model or more GPUs")
    policies = list(engine.POLICIES) if args.policy == "all" else [args.policy]
    rows = [engine.simulate(job, prof, p, start, changes, args.hours, takes=takes).summary() for p in policies]
    return _print_rows(rows, args.json, lambda r: (
        f"{r['policy']:<16} goodput {r['goodput']:.4f}  efficiency {r['efficiency']:.4f}  downtime {r['downtime_s']:.1f} s"
        f"  lost {r['lost_s']:.1f} s  events {r['events']} (fail-stops {r['fail_stops']})"))


def _calibrate(args: argparse.Namespace) -> int:
    from liver.policy.profile import CALIBRATION
    from liver.sim import calibrate

    args.out = args.out or str(CALIBRATION)
    if args.check:
        ok = calibrate.check(Path(args.results), Path(args.out))
        print(f"{args.out}: " + (f"what {args.results} gives" if ok else "out of date (liver sim calibrate)"))
        return 0 if ok else 1
    data = calibrate.write(Path(args.results), Path(args.out))
    print(json.dumps(data["profiles"]["h200"]["values"], indent=1))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from liver.sim import calibrate, results, validate

    measured = results.measurements(Path(args.results))
    v, _ = calibrate.fit(*measured)
    result = validate.validate(*measured, full=v)
    cpu = Path(args.results) / "cpu-target-choice" / "target.json"
    if cpu.exists():
        result["target_choice_cpu"] = validate.validate_choice(cpu)
        base = {**v, **calibrate.fit_cpu(results.cpu_samples(cpu))[0]}
        fitted = results.cpu_events(Path(args.results))
        handoffs = validate.validate_cpu_handoffs(fitted, base)
        if handoffs:
            result["cpu_handoffs"] = handoffs
        reconfig = validate.validate_cpu_reconfig(results.cpu_reconfig_events(Path(args.results)), fitted, base)
        if reconfig:
            result["cpu_reconfig_held_out"] = reconfig
    held = validate.validate_held_out(results.held_out(Path(args.results)), v, measured[0])
    if held:
        result["held_out_live"] = held
    dcp = validate.held_out_dcp(Path(args.results))
    if dcp:
        result["held_out_dcp"] = validate.validate_dcp(dcp, v)
    print(json.dumps(result if args.json else {"summary": result["summary"], "target_choice_cpu": {
        k: {kk: vv for kk, vv in x.items() if kk != "rows"} for k, x in result.get("target_choice_cpu", {}).items()},
        "steps_held_out": result["steps"]["held_out"],
        "held_out_live": held and {k: held[k] for k in ("sources", "handoffs_not_in_the_fit", "summary")},
        "noise_floor_same_event_other_run": result["noise_floor_same_event_other_run"],
        "held_out_dcp": result.get("held_out_dcp"),
        "cpu_handoffs": result.get("cpu_handoffs") and result["cpu_handoffs"]["summary"],
        "cpu_reconfig_held_out": result.get("cpu_reconfig_held_out") and result["cpu_reconfig_held_out"]["summary"]},
        indent=1))
    return 0


def _project(args: argparse.Namespace) -> int:
    _simulator()  # (its projections run the simulator)
    from liver.sim import project

    out = Path(args.out)
    try:  # (refused before any work: a projection takes up to a minute)
        out.mkdir(parents=True, exist_ok=True)
        (out / ".liver-write-check").touch()
        (out / ".liver-write-check").unlink()
    except OSError as e:
        raise ValueError(f"--out={args.out}: no folder can be written there ({e.strerror}); allowed a writable "
                         f"folder, made if missing") from None
    if args.seeds < 1:
        raise ValueError(f"--seeds={args.seeds}: allowed 1 or more runs of each regime")
    if args.what == "goodput":  # (a missing trace is refused before any work, never skipped: project.goodput)
        result = project.goodput(out, Path(args.traces), model=args.model, gpus=args.gpus, seeds=args.seeds)
    else:
        result = getattr(project, args.what)(out)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return 0


def bench_sim_speed(args: argparse.Namespace) -> int:
    import time

    engine, sources = _simulator()
    from liver.sim.models import sim_model
    from liver.policy.profile import load

    start, changes = sources.from_trace(args.trace, args.gpus_per_node, hours=8)
    job, prof = sim_model(args.model), load("h200")
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.simulate(job, prof, "live", start, changes, 8)
    row = {"trace": args.trace, "gpus_at_peak": max([start] + [c.gpus for c in changes]), "model": args.model,
           "hours": 8, "changes": len(changes), "wall_s": time.perf_counter() - t0,
           "cpu_s": time.process_time() - c0, "goodput": out.goodput, "goal_s": 10.0}
    row["met"] = row["cpu_s"] <= row["goal_s"]
    print(json.dumps(row, indent=1))
    return 0 if row["met"] else 1


def add_parsers(sub) -> None:
    """``liver sim ...``: its commands and their flags."""
    sm = sub.add_parser("sim", help="the calibrated simulator of elastic training (liver/sim)")
    ssub = sm.add_subparsers(dest="sim", required=True)
    sr = ssub.add_parser("run", help="one job under a trace, a schedule or a volatility regime, by policy")
    sr.add_argument("--model", default="14b-cluster", help="1b-cluster, 3b-cluster, 7b-cluster, 14b-cluster, 30b-cluster, 70b-cluster, 175b-cluster")
    sr.add_argument("--profile", default="h200", help="h200 (calibrated) or a800-pcie")
    sr.add_argument("--gpus", type=int, default=32, help="GPUs at the start (schedule, regime)")
    src2 = sr.add_mutually_exclusive_group()
    src2.add_argument("--trace", help="a spot trace: Bamboo's lines (time_ms,add|remove,nodeNAME) or SkyPilot's JSON "
                                      "({\"metadata\": {\"gap_seconds\": G}, \"data\": [instances a tick]})")
    src2.add_argument("--events", help="a schedule file (time triggers)")
    sr.add_argument("--gpus-per-node", type=int, default=1, help="GPUs of a trace's node")
    sr.add_argument("--interval-min", type=float, default=10.0, help="regime: mean minutes between events")
    sr.add_argument("--notice-s", type=float, default=120.0, help="a loss's notice (s)")
    sr.add_argument("--hours", type=float, default=8.0)
    sr.add_argument("--seed", type=int, default=0, help="a regime's events and which nodes a loss takes")
    sr.add_argument("--takes", default="random", help="where the job runs on fewer GPUs than there are, which "
                    "nodes a loss takes: random (default), idle-first (the best case), job-first (the worst)")
    sr.add_argument("--policy", default="all", help="live, live-precopy, restart-storage, restart-memory, restart-periodic, dp-only, all")
    sr.add_argument("--json", action="store_true")
    sr.set_defaults(fn=_run)
    sc2 = ssub.add_parser("calibrate", help="fit the H200 profile to bench/results (writes liver/policy/calibration.json)")
    sc2.add_argument("--results", default="bench/results")
    sc2.add_argument("--out", default=None, help="default: liver/policy/calibration.json")
    sc2.add_argument("--check", action="store_true", help="only check that the file is what the results give")
    sc2.set_defaults(fn=_calibrate)
    sv = ssub.add_parser("validate", help="leave-one-out: each measured event against the fit of the others")
    sv.add_argument("--results", default="bench/results")
    sv.add_argument("--json", action="store_true", help="every event, not only the summary")
    sv.set_defaults(fn=_validate)
    sp = ssub.add_parser("project", help="a projection, JSON and PNG: downtime, prepare, goodput, precopy or paper")
    sp.add_argument("what", choices=["downtime", "prepare", "goodput", "precopy", "paper"])
    sp.add_argument("--out", required=True)
    sp.add_argument("--traces", default=str(DEFAULT_TRACES),
                    help="the folder of p3-trace.csv and g4dn-trace.csv (default: the repository's traces/bamboo)")
    sp.add_argument("--model", default="14b-cluster", help="goodput: the model (liver.sim.models)")
    sp.add_argument("--gpus", type=int, default=32, help="goodput: the regimes' GPUs")
    sp.add_argument("--seeds", type=int, default=5, help="goodput: runs of each regime")
    sp.set_defaults(fn=_project)
