"""The ``liver bench`` subcommands: registered by ``add_parsers``; each
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


def bench_precopy(args: argparse.Namespace) -> int:
    from liver.bench.precopy import run

    rows = run(sizes=args.sizes.split(","), changes=args.changes.split(","), cycles=args.cycles, gap=args.gap,
               run_dir=Path(args.run_dir) if args.run_dir else None)
    return print_rows(rows, args.json, lambda r: (
        f"{r['change']:<28} {r['size']:<5} ({r['parameters'] / 1e6:.1f}M) pre-copy {'on ' if r['precopy'] else 'off'}  "
        f"downtime {r['downtime_median_s'] * 1e3:.1f} ms [{r['downtime_interval_s'][0] * 1e3:.1f}, "
        f"{r['downtime_interval_s'][1] * 1e3:.1f}]  transfer {r['transfer_median_s'] * 1e3:.1f} ms  "
        + (f"streamed at the switch {r['bytes_streamed_at_switch']:,} B, pre-copied {r['bytes_precopied']:,} B, "
           f"mirroring {r['mirror_overhead']:+.1%} a step over {r['mirrored_steps_median']:g} steps "
           f"({r['mirror_extra_median_s'] * 1e3:+.1f} ms in all)" if r['precopy'] else
           f"streamed at the switch {r['bytes_moved']:,} B")))


def bench_handoffs(args: argparse.Namespace) -> int:
    from liver.bench.handoffs import run

    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k != "steady_overhead_by_kind"}, indent=1))
    return 0 if result.get("digests_equal") else 1


def bench_nodes(args: argparse.Namespace) -> int:
    from liver.bench.nodes import run
    from liver.policy.outcome import Outcome

    result = run(args)
    for e in result["events"]:
        print(f"{e['event']} {e['old']} -> {e['new']} ({e['node']}): live {e['downtime_live_s']}, restart "
              f"{e['downtime_restart_s']} s; digest equal {e['digest_equal_live']}/{e['digest_equal_restart']}")
    ok = all(e["digest_equal_live"] and e["outcome_live"] == Outcome.DONE.value for e in result["events"])
    return 0 if ok and len(result["events"]) == 2 else 1


def bench_host_copy(args: argparse.Namespace) -> int:
    from liver.bench.host_copy import main

    return main(args)


def bench_control_plane(args: argparse.Namespace) -> int:
    from liver.bench.control_plane import run

    result = run(args)
    for r in result["rows"]:
        print(f"{r['nodes']:>5} nodes: {r['syncs_per_s']:7.0f} syncs/s and {r['waits_per_s']:.0f} waits/s "
              f"(interval {r['interval_s'] or 0:.2f} s), sync "
              f"median {(r['sync_rtt_median_s'] or 0) * 1e3:.1f} ms p99 {(r['sync_rtt_p99_s'] or 0) * 1e3:.1f} ms; "
              f"/status p99 {r['status_p99_s'] * 1e3:.1f} ms; steps x{r['steps_vs_no_nodes'] or 0:.2f}"
              + (f"; a silent node declared lost after {r['lost_detected_s']:.2f} s (promised "
                 f"{r['lost_after_s'] or 0:.1f} s)" if r.get("lost_detected_s") is not None else
                 "; a silent node not declared lost within the stage" if r["nodes"] else "")
              + (f"; commands to a real node taken after {', '.join(f'{d * 1e3:.0f}' for d in r['command_delivery_s'])} ms"
                 if r["command_delivery_s"] else "")
              + (f"; errors {r['errors']}" if r["errors"] else ""))
    return 0 if not any(r["errors"] for r in result["rows"]) else 1


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
              args.backend, args.set or (), args.copy_mib)
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
        f"{r['native_at_switch_s']:.3f} s; the first step's extra: native {_s(r['native_first_extra_s'])} "
        f"({_s(r['native_at_switch_first_extra_s'])} with nothing made before), reference "
        f"{_s(r['reference_first_extra_s'])}; build and first step "
        f"{'-' if r['with_first_step_ratio'] is None else format(r['with_first_step_ratio'], '.2f')}x"))


def _s(seconds: float | None) -> str:
    return "no step (out of memory)" if seconds is None else f"{seconds:.3f} s"


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


def _counts(flag: str, text: str, allowed: str) -> list[int]:
    """A comma-separated list of counts; ValueError naming the flag otherwise."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}={text!r}: allowed {allowed}") from None


def bench_host_start(args: argparse.Namespace) -> int:
    from liver.bench.host_start import run

    result = run(_counts("--procs", args.procs, "process counts, e.g. 1,2,4,8"), read_mib=args.read_mib, repeats=args.repeats,
                 run_dir=Path(args.run_dir) if args.run_dir else None)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(result["rows"], indent=1))
    return 0


def bench_rendezvous(args: argparse.Namespace) -> int:
    from liver.bench.rendezvous import run

    result = run(_counts("--ranks", args.ranks, "rank counts, e.g. 8,64,256,1024"), procs=args.procs, repeats=args.repeats)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    return 0


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


def add_parsers(sub) -> None:
    """``liver bench ...``: its benchmarks and their flags."""
    from liver.sim.commands import bench_sim_speed

    b = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bp = bsub.add_parser("plan", help="planner speed on GPT-3 175B at 1,024-2,048 ranks")
    bp.add_argument("--json", action="store_true")
    bp.add_argument("--repeats", type=int, default=3, help="best of N timings per scenario")
    bp.add_argument("--pickle", action="store_true",
                    help="instead: CPU time of reading the controller's plan against planning again")
    bp.set_defaults(fn=bench_plan)
    br = bsub.add_parser("reconfig", help="live vs stop-and-restart downtime, tiny model on CPU")
    br.add_argument("--json", action="store_true")
    br.add_argument("--repeats", type=int, default=1, help="runs per scenario and mode (median taken)")
    br.add_argument("--steps", type=int, default=20, help="steps after the event, per run")
    br.add_argument("--calm-steps", type=int, default=60,
                    help="steps before the event, per run: the baseline of the steady-state overhead")
    br.add_argument("--cycles", type=int, default=1,
                    help="events of the scenario per live run (each followed by the event back): more "
                         "preparing steps for the steady-state overhead")
    br.add_argument("--world", type=int, default=None,
                    help="scenario set by its largest process count: 2 or 4 (default: the largest "
                         "with a core per process)")
    br.add_argument("--workload", default=None, metavar="FILE",
                    help="a job file whose engine and job are benchmarked, e.g. configs/llama-native.toml "
                         "(a user's own model); default: the reference engine's tiny job")
    br.add_argument("--run-dir", default=None)
    br.set_defaults(fn=bench_reconfig)
    bpc = bsub.add_parser("precopy", help="one change's pause with pre-copy and without, at the tiny model and "
                                          "about 10x and 30x larger, on CPU (gloo)")
    bpc.add_argument("--json", action="store_true")
    bpc.add_argument("--sizes", default="tiny,x10,x30", help="model sizes, comma-separated: tiny, x10, x30")
    bpc.add_argument("--changes", default="reshape,scale-in,scale-out",
                     help="changes, comma-separated: reshape, scale-in, scale-out")
    bpc.add_argument("--cycles", type=int, default=4, help="events of each change per run (each followed by the way back)")
    bpc.add_argument("--gap", type=int, default=20, help="steps between events")
    bpc.add_argument("--run-dir", default=None)
    bpc.set_defaults(fn=bench_precopy)
    bh = bsub.add_parser("handoffs", help="a scenario of events live and by stop-and-restart in one call, any "
                                          "backend (the GPU runs; on gloo a CPU dry run)")
    bh.add_argument("--scenario", default="x2", help="x2, x2-twice, x2-native (TP2 <-> FSDP2), x2-cycles (with "
                                                     "--cycles, --gap), x8")
    bh.add_argument("--model", default="1b", help="preset: tiny, tiny8, 1b, 3b, 7b")
    bh.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                    help="a field of the job beyond the preset, e.g. job.model.vocab_size=50304 (repeatable)")
    bh.add_argument("--engine", default=None, help="the engine or recipe by import path (a user's own model: "
                                                   "examples/llama.py:RECIPE at the preset's shape); default: the reference engine")
    bh.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    bh.add_argument("--connect", default="auto", choices=["auto", "background", "boundary"])
    bh.add_argument("--budget-mib", type=int, default=512, help="staging budget B per rank")
    bh.add_argument("--cycles", type=int, default=4, help="x2-cycles: rounds of its four events")
    bh.add_argument("--gap", type=int, default=12, help="x2-cycles: steps between events")
    bh.add_argument("--live-only", action="store_true", help="no restart run (the overhead over many events)")
    bh.add_argument("--run-root", default=None, help="run directories here (e.g. /dev/shm); default: --out")
    bh.add_argument("--out", required=True, help="results: handoffs.json, reports, timelines")
    bh.set_defaults(fn=bench_handoffs)
    bn = bsub.add_parser("nodes", help="two node agents on this machine (a GPU each) under one controller: a notice "
                                       "to node1, then node1 back; live and by restart")
    bn.add_argument("--model", default="1b", help="preset: tiny, 1b, 3b, ...")
    bn.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                    help="a field of the job beyond the preset, e.g. job.model.vocab_size=50304 (repeatable)")
    bn.add_argument("--engine", default=None, help="the engine or recipe by import path (default: the reference engine)")
    bn.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    bn.add_argument("--gap", type=int, default=20, help="steps between the events")
    bn.add_argument("--notice-s", type=float, default=60.0, help="node1's notice (s)")
    bn.add_argument("--timeout-s", type=float, default=600.0, help="the most any phase may take (s)")
    bn.add_argument("--out", required=True, help="results: nodes.json, the run directories")
    bn.set_defaults(fn=bench_nodes)
    bc = bsub.add_parser("control-plane", help="a controller training a job on one node while many simulated "
                                               "node agents sync with it: its syncs/s, their round trips, its answers")
    bc.add_argument("--nodes", default="0,100,300,1000", help="simulated node counts, one stage each (comma list)")
    bc.add_argument("--seconds", type=float, default=10.0, help="each stage's length")
    bc.add_argument("--syncs-per-s", type=float, default=1000.0,
                    help="the controller's controller.syncs_per_s (1000000: every node every 0.1 s)")
    bc.add_argument("--long-poll", choices=("on", "off"), default="on",
                    help="the controller's controller.long_poll (off: syncs every interval, commands wait for them)")
    bc.add_argument("--procs", type=int, default=4, help="processes the simulated agents run in (threads each)")
    bc.add_argument("--agent-timeout-s", type=float, default=10.0,
                    help="the controller's controller.agent_timeout_s (the silent node is declared lost after it)")
    bc.add_argument("--out", required=True, help="results: control_plane.json, the run directory")
    bc.set_defaults(fn=bench_control_plane)
    bt = bsub.add_parser("transfer", help="the streaming executor alone on 2 GPUs: tp1 -> tp2 of a 0.6B and a 1.1B state")
    bt.add_argument("--out", required=True)
    bt.add_argument("--budget-mib", type=int, default=512, help="staging budget B per rank")
    bt.set_defaults(fn=bench_transfer)
    bc = bsub.add_parser("core-binding", help="CPU step times with workers bound to their slots' cores and not")
    bc.add_argument("--json", action="store_true")
    bc.add_argument("--repeats", type=int, default=3, help="interleaved runs of each")
    bc.add_argument("--steps", type=int, default=800, help="steps per run")
    bc.add_argument("--run-dir", default=None)
    bc.set_defaults(fn=bench_core_binding)
    bm = bsub.add_parser("measured", help="the README's Measured section from bench/results (claims.toml)")
    bm.add_argument("--write", action="store_true", help="rewrite the section (default: only check it)")
    bm.set_defaults(fn=bench_measured)
    bb = bsub.add_parser("boot", help="a cold joiner's cost before its Shadow World: fresh interpreter vs "
                                      "forked from the zygote")
    bb.add_argument("--json", action="store_true")
    bb.add_argument("--repeats", type=int, default=5, help="workers per way of starting (median taken)")
    bb.add_argument("--model", default="tiny", help="preset: tiny, 1b, 3b")
    bb.add_argument("--parallel", default="1,1,2", help="the joiner's configuration tp,pp,dp (rank 0)")
    bb.add_argument("--warmup-steps", type=int, default=2, help="mock-world warm-up steps")
    bb.add_argument("--run-dir", default=None)
    bb.set_defaults(fn=bench_boot)
    bhs = bsub.add_parser("host-start", help="k processes of one host started together (imports, CUDA context, "
                                             "a shard read from disk, to the device), against one alone")
    bhs.add_argument("--procs", default="1,2,4,8", help="process counts, e.g. 1,2,4,8")
    bhs.add_argument("--read-mib", type=int, default=256, help="each process's shard (MiB)")
    bhs.add_argument("--repeats", type=int, default=3, help="runs of each count, interleaved")
    bhs.add_argument("--run-dir", default=None, help="where the shards are written (the disk measured)")
    bhs.add_argument("--out", default=None, metavar="FILE", help="the whole result as JSON")
    bhs.set_defaults(fn=bench_host_start)
    bhc = bsub.add_parser("host-copy", help="a GPU's copies to and from pinned host memory, one way and both ways "
                                            "at once (a restart from host memory)")
    bhc.add_argument("--mib", default="256,1024", help="copy sizes (MiB), e.g. 256,1024")
    bhc.add_argument("--repeats", type=int, default=10, help="timed copies per size and direction")
    bhc.add_argument("--out", default=None, metavar="FILE", help="the whole result as JSON")
    bhc.set_defaults(fn=bench_host_copy)
    brv = bsub.add_parser("rendezvous", help="N ranks' rendezvous through one TCPStore (connect, publish, count, "
                                             "wait, read rank 0's key): its time as N grows")
    brv.add_argument("--ranks", default="8,64,256,1024", help="rank counts, e.g. 8,64,256,1024")
    brv.add_argument("--procs", type=int, default=8, help="worker processes the ranks are spread over (a thread a rank)")
    brv.add_argument("--repeats", type=int, default=3, help="runs of each count, interleaved")
    brv.add_argument("--out", default=None, metavar="FILE", help="the whole result as JSON")
    brv.set_defaults(fn=bench_rendezvous)
    bhe = bsub.add_parser("heal", help="a replica killed: healed from the survivor vs recovered from the checkpoint")
    bhe.add_argument("--repeats", type=int, default=3)
    bhe.add_argument("--ckpt-every", type=int, default=10)
    bhe.add_argument("--kill-after", type=int, default=6, help="steps past a checkpoint at which the kill lands")
    bhe.add_argument("--steps", type=int, default=60)
    bhe.add_argument("--run-dir", default=None)
    bhe.set_defaults(fn=bench_heal)
    bso = bsub.add_parser("soak", help="random events (every kind, kills, hangs, notices, overlaps) on a CPU job, "
                                       "checked for digest parity and step continuity")
    bso.add_argument("--events", type=int, default=100)
    bso.add_argument("--seed", type=int, default=1)
    bso.add_argument("--slots", type=int, default=4, help="processes the job may use")
    bso.add_argument("--ckpt-every", type=int, default=5)
    bso.add_argument("--replays", type=int, default=3, help="recoveries replayed by restart and compared step by step")
    bso.add_argument("--run-dir", default=None)
    bso.add_argument("--out", default=None, metavar="FILE", help="the whole result, with the driver's log, as JSON")
    bso.set_defaults(fn=bench_soak)
    bta = bsub.add_parser("target", help="every valid configuration timed on CPU against the controller's choice")
    bta.add_argument("--counts", default="2-8", help="process counts, e.g. 2-8")
    bta.add_argument("--steps", type=int, default=25, help="steps per configuration")
    bta.add_argument("--run-dir", default=None)
    bta.set_defaults(fn=bench_target)
    bss = bsub.add_parser("sim-speed", help="the simulator's CPU time for an 8-hour trace at 1,024 GPUs")
    bss.add_argument("--trace", required=True, help="a spot trace (p3: 32 nodes at its peak)")
    bss.add_argument("--gpus-per-node", type=int, default=32)
    bss.add_argument("--model", default="70b-cluster")
    bss.set_defaults(fn=bench_sim_speed)
    bd = bsub.add_parser("dcp", help="one device: a model's step time, DCP save and load of its state to each directory")
    bd.add_argument("--model", action="append", help="a preset (repeat the flag for several; default 1b)")
    bd.add_argument("--dir", action="append", help="where to write (repeat: local disk, /dev/shm; default the temp dir)")
    bd.add_argument("--repeats", type=int, default=3)
    bd.add_argument("--steps", type=int, default=8)
    bd.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    bd.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                    help="a field of each model's job beyond its preset, e.g. job.model.hidden_size=1024 (repeatable)")
    bd.add_argument("--copy-mib", type=int, default=1024, help="the device-local copy timed beside the saves (MiB)")
    bd.add_argument("--out", required=True)
    bd.set_defaults(fn=bench_dcp)
    bbu = bsub.add_parser("build", help="the engine construction a switch does before its transfer, native "
                                        "against reference, rank 0 of each layout over a mock world")
    bbu.add_argument("--engine", default="examples/llama.py:RECIPE", metavar="FILE:RECIPE")
    bbu.add_argument("--model", default="1b", help="the preset whose shape is built (default 1b)")
    bbu.add_argument("--parallel", action="append", metavar="TP,PP,DP",
                     help="a layout (repeatable; default 1,1,4 2,1,2 4,1,1)")
    bbu.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE")
    bbu.add_argument("--repeats", type=int, default=3)
    bbu.add_argument("--json", action="store_true")
    bbu.set_defaults(fn=bench_build)
    bo = bsub.add_parser("overhead", help="one device: the recipe's step in a plain PyTorch loop and under LiveR "
                                          "with no event, interleaved in fresh processes; the per-step difference")
    bo.add_argument("--engine", required=True, metavar="FILE:RECIPE", help="the recipe, e.g. examples/llama.py:RECIPE")
    bo.add_argument("--model", default="1b", help="the preset whose shape it trains (default 1b)")
    bo.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                    help="a field of the job beyond its preset, e.g. job.train.global_batch=8 (repeatable)")
    bo.add_argument("--steps", type=int, default=60, help="steps a run (default 60)")
    bo.add_argument("--rounds", type=int, default=3, help="runs of each kind, interleaved (default 3)")
    bo.add_argument("--warmup", type=int, default=10, help="steps of each run left out (default 10)")
    bo.add_argument("--out", required=True)
    bo.set_defaults(fn=bench_overhead)
