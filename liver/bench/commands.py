"""The ``liver bench`` subcommands: each parses nothing itself (``liver.cli`` builds the flags),
runs its benchmark and prints its JSON or its lines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def bench_plan(args: argparse.Namespace) -> int:
    from liver.bench.plan import run, run_pickle

    if args.pickle:
        return print_rows(run_pickle(), args.json, lambda r: (
            f"{r['model']:<6} {r['old']} -> {r['new']}: plan {r['plan_cpu_s'] * 1e3:.2f} ms, unpickle "
            f"{r['unpickle_cpu_s'] * 1e3:.2f} ms of CPU ({r['pickle_bytes']:,} bytes)"))

    return print_rows(run(repeats=args.repeats), args.json, lambda r: (
        f"{r['scenario']:<60} tasks {r['num_tasks']:>8,}  moved {r['bytes_moved'] / 1e12:7.2f} TB "
        f"(identity placement {r['bytes_moved_identity_placement'] / 1e12:7.2f} TB)  plan {r['plan_s']:.3f} s"))


def print_rows(rows: list[dict], as_json: bool, line) -> int:
    """A benchmark's rows: the JSON list, or one line each."""
    print(json.dumps(rows, indent=1) if as_json else "\n".join(line(r) for r in rows))
    return 0


def bench_reconfig(args: argparse.Namespace) -> int:
    from liver.bench.reconfig import run

    rows = run(repeats=args.repeats, steps=args.steps, run_dir=Path(args.run_dir) if args.run_dir else None,
               calm=args.calm_steps, world=args.world, cycles=args.cycles, workload_file=args.workload)
    return print_rows(rows, args.json, lambda r: (
        f"{r['scenario']:<40} live {r['downtime_live_s']:.3f} s  restart {r['downtime_restart_s']:.2f} s  "
        f"ratio {r['ratio']:.1f}x (forked restart {r['downtime_restart_forked_s']:.2f} s: {r['ratio_forked']:.1f}x)  prepare {r['prepare_s']:.2f} s  steady overhead {r['steady_overhead']:+.2%}"))


def bench_handoffs(args: argparse.Namespace) -> int:
    from liver.bench.handoffs import run

    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k != "steady_overhead_by_kind"}, indent=1))
    return 0 if result.get("digests_equal") else 1


def bench_nodes(args: argparse.Namespace) -> int:
    from liver.bench.nodes import run

    result = run(args)
    for e in result["events"]:
        print(f"{e['event']} {e['old']} -> {e['new']} ({e['node']}): live {e['downtime_live_s']}, restart "
              f"{e['downtime_restart_s']} s; digest equal {e['digest_equal_live']}/{e['digest_equal_restart']}")
    ok = all(e["digest_equal_live"] and e["status_live"] == "done" for e in result["events"])
    return 0 if ok and len(result["events"]) == 2 else 1


def bench_transfer(args: argparse.Namespace) -> int:
    from liver.bench.transfer import run

    report = run(args.out, args.budget_mib)
    for k, v in report["models"].items():
        print(k, {kk: vv for kk, vv in v.items() if kk != "per_rank"})
    return 0 if all(v["bit_exact"] for v in report["models"].values()) else 1


def bench_core_binding(args: argparse.Namespace) -> int:
    from liver.bench.core_binding import run

    out = run(repeats=args.repeats, steps=args.steps, run_dir=Path(args.run_dir) if args.run_dir else None)
    b, u = out["bound"]["pooled"], out["unbound"]["pooled"]
    print(json.dumps(out, indent=1) if args.json else
          f"bound {b['median_ms']:.1f} ms median, unbound {u['median_ms']:.1f} ms ({out['repeats']} runs each)")
    return 0


def bench_dcp(args: argparse.Namespace) -> int:
    import tempfile

    from liver.bench.dcp import run

    out = run(args.model or ["1b"], args.dir or [tempfile.gettempdir()], Path(args.out), args.repeats, args.steps,
              args.backend, args.set or ())
    for r in out["rows"]:
        parts = ", ".join(f"{d}: skipped ({v['skipped']})" if "skipped" in v else
                          f"{d}: save {v['save_GBps']:.2f} GB/s, load {v['load_GBps']:.2f} GB/s"
                          for d, v in r["dirs"].items())
        print(f"{r['model']} ({r['state_bytes'] / 1e9:.1f} GB of state) on {r['device']}: step {r['step_s']:.3f} s; {parts}")
    return 0


def bench_build(args: argparse.Namespace) -> int:
    from liver.bench.build import run

    rows = run(args.engine, args.model, args.parallel or ["1,1,4", "2,1,2", "4,1,1"], args.repeats, args.set or [])
    return print_rows(rows, args.json, lambda r: (
        f"{r['model']} {r['parallel']:<12} on {r['device']}: left in the switch: native {r['native_s']:.3f} s "
        f"(made before: {r['native_prebuild_s']:.3f} s), reference {r['reference_s']:.3f} s: {r['ratio']:.2f}x; "
        f"native with storage made in the switch {r['native_structure_s']:.3f} s, all in the switch "
        f"{r['native_at_switch_s']:.3f} s"))


def bench_overhead(args: argparse.Namespace) -> int:
    from liver.bench.overhead import run

    r = run(args.engine, args.model, args.set or [], args.steps, args.rounds, args.warmup, Path(args.out))
    lo, hi = r["overhead_ci95"]
    print(json.dumps({k: v for k, v in r.items() if k != "runs"}, indent=1))
    print(f"{r['model']} on {r['device']}: plain {r['median_step_s']['plain'] * 1e3:.1f} ms, LiveR "
          f"{r['median_step_s']['liver'] * 1e3:.1f} ms a step: overhead {r['overhead']:+.2%} (95% {lo:+.2%} .. {hi:+.2%})"
          + (f"; MFU plain {r['mfu']['plain']:.1%}, LiveR {r['mfu']['liver']:.1%}" if r["mfu"]["plain"] else ""))
    return 0


def bench_measured(args: argparse.Namespace) -> int:
    from liver.bench.measured import run

    current = run(args.write)
    print("README.md: Measured section " + ("written" if args.write else "current" if current else
                                             "out of date (liver bench measured --write)"))
    return 0 if current else 1


def bench_boot(args: argparse.Namespace) -> int:
    from liver.bench.boot import run

    rows = run(repeats=args.repeats, model=args.model, parallel=args.parallel, warmup_steps=args.warmup_steps,
               run_dir=Path(args.run_dir) if args.run_dir else None)
    return print_rows(rows, args.json, lambda r: (
        f"{r['start']:<24} CPU {r['cpu_s']:.3f} s  wall {r['wall_s']:.3f} s  "
        f"fresh/this: CPU {r['cpu_ratio_fresh_over_this']:.1f}x, wall {r['wall_ratio_fresh_over_this']:.1f}x"))


def bench_target(args: argparse.Namespace) -> int:
    from liver.bench.target import run

    lo, _, hi = args.counts.partition("-")
    result = run(list(range(int(lo), int(hi or lo) + 1)), steps=args.steps,
                 run_dir=Path(args.run_dir) if args.run_dir else None)
    print(json.dumps(result, indent=1))
    return 0


def bench_heal(args: argparse.Namespace) -> int:
    from liver.bench.heal import run

    result = run(repeats=args.repeats, ckpt_every=args.ckpt_every, kill_after=args.kill_after, steps=args.steps,
                 run_dir=Path(args.run_dir) if args.run_dir else None)
    print(json.dumps(result, indent=1))
    return 0 if result["digests_equal"] else 1


def bench_soak(args: argparse.Namespace) -> int:
    from liver import logs
    from liver.bench.soak import run

    logs.setup()  # the job's phases and the driver's actions, one line each
    result = run(events=args.events, seed=args.seed, slots=args.slots, ckpt_every=args.ckpt_every,
                 run_dir=Path(args.run_dir) if args.run_dir else None, replay_sample=args.replays)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "driver"}, indent=1))
    return 0 if result["ok"] else 1
