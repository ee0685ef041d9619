"""The ``liver`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from liver.topology import ParallelConfig


def _bench_plan(args: argparse.Namespace) -> int:
    from liver.bench.plan import run

    return _print_rows(run(repeats=args.repeats), args.json, lambda r: (
        f"{r['scenario']:<60} tasks {r['num_tasks']:>8,}  moved {r['bytes_moved'] / 1e12:7.2f} TB "
        f"(identity placement {r['bytes_moved_identity_placement'] / 1e12:7.2f} TB)  plan {r['plan_s']:.3f} s"))


def _print_rows(rows: list[dict], as_json: bool, line) -> int:
    """A benchmark's rows: the JSON list, or one line each."""
    print(json.dumps(rows, indent=1) if as_json else "\n".join(line(r) for r in rows))
    return 0


DEFAULT_EVENTS = """\
# the embedded schedule of `liver run` (and `make demo`): one event per line, see
# liver/controller/events.py for the grammar; events are handled one at a time, in this order
at step 6: scale-out 4                 # two cold processes join; the controller picks tp,pp,dp
at step 12: reshape 2,2,1              # same four processes, new layout
at step 18: scale-in 2 deadline 20s    # preemption notice for two GPUs
"""


def _run(args: argparse.Namespace) -> int:
    from liver.controller import report as rep
    from liver.controller.controller import RunOptions
    from liver.controller.events import parse_schedule, parse_trace
    from liver.controller.job import run_job
    from liver.controller.target import Hardware
    from liver.topology.presets import preset

    job = preset(args.model)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix=f"liver-run-{args.mode}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    slots = args.slots
    if slots is None:
        if args.backend == "nccl":
            import torch
            slots = torch.cuda.device_count()
        else:
            slots = 4
    gpus = args.gpus
    if args.trace:
        events = parse_trace(args.trace, slots=slots, compress=args.compress, notice_s=args.notice)
        gpus = events.pop(0).gpus
    else:
        path = args.events
        if path is None:
            path = run_dir / "events.txt"
            path.write_text(DEFAULT_EVENTS)
        events = parse_schedule(path)
    if args.steps < 1:
        raise ValueError(f"--steps={args.steps}: allowed a positive step count")
    if gpus < 1 or gpus > slots:
        raise ValueError(f"--gpus={gpus}: allowed 1 to --slots={slots}")
    initial = ParallelConfig.parse(args.parallel) if args.parallel else None
    if initial is not None and initial.world_size != gpus:
        raise ValueError(f"--parallel={args.parallel}: tp*pp*dp={initial.world_size} but --gpus={gpus}")
    hw = Hardware(memory_bytes=args.memory_gib * 2**30 if args.memory_gib else None)
    opts = RunOptions(steps=args.steps, gpus=gpus, slots=slots, backend=args.backend, initial=initial,
                      ckpt_every=args.ckpt_every, digest=args.digest, budget_bytes=args.budget_mib << 20,
                      warmup_steps=args.warmup_steps, warm=args.warm, hardware=hw, token=args.token,
                      companion_share=args.companion_share, bind_cores=not args.no_bind_cores,
                      endpoint=not args.no_endpoint,
                      end_after_events=None if args.end_after_events < 0 else args.end_after_events)
    print(f"liver run --mode {args.mode}: model {args.model} ({job.model.num_params():,} parameters), "
          f"{gpus} of {slots} slots, {args.steps} steps, {len(events)} events, backend {args.backend}, "
          f"run dir {run_dir}", flush=True)
    report = run_job(job, opts, events, run_dir, args.mode,
                     {"model": args.model, "events_source": str(args.trace or args.events or "embedded")})
    print("\n" + rep.summary(report))
    print(f"report: {run_dir / 'report.json'}\ntimeline: {run_dir / 'timeline.png'}")
    bad = [e for e in report["events"] if e.get("digest_equal") is False]
    return 1 if bad else 0


def _scale(args: argparse.Namespace) -> int:
    from liver.controller.endpoint import request

    url, token = args.url, args.token
    if args.run_dir:
        info = json.loads((Path(args.run_dir) / "control.json").read_text())
        url, token = url or info["url"], token or info["token"]
    if not url:
        raise ValueError("--run-dir or --url: the controller to talk to")
    code, body = request(url, token, "POST", "/scale", {"action": " ".join(args.action)})
    print(json.dumps(body))
    return 0 if code == 202 else 1


def _bench_reconfig(args: argparse.Namespace) -> int:
    from liver.bench.reconfig import run

    rows = run(repeats=args.repeats, steps=args.steps, run_dir=Path(args.run_dir) if args.run_dir else None,
               calm=args.calm_steps, world=args.world, cycles=args.cycles)
    return _print_rows(rows, args.json, lambda r: (
        f"{r['scenario']:<40} live {r['downtime_live_s']:.3f} s  restart {r['downtime_restart_s']:.2f} s  "
        f"ratio {r['ratio']:.1f}x (forked restart {r['downtime_restart_forked_s']:.2f} s: {r['ratio_forked']:.1f}x)  prepare {r['prepare_s']:.2f} s  steady overhead {r['steady_overhead']:+.2%}"))


def _bench_boot(args: argparse.Namespace) -> int:
    from liver.bench.boot import run

    rows = run(repeats=args.repeats, model=args.model, parallel=args.parallel, warmup_steps=args.warmup_steps,
               run_dir=Path(args.run_dir) if args.run_dir else None)
    return _print_rows(rows, args.json, lambda r: (
        f"{r['start']:<24} CPU {r['cpu_s']:.3f} s  wall {r['wall_s']:.3f} s  "
        f"fresh/this: CPU {r['cpu_ratio_fresh_over_this']:.1f}x, wall {r['wall_ratio_fresh_over_this']:.1f}x"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="liver", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train and reconfigure live (the main job)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--events", help="schedule file (default: the embedded schedule)")
    src.add_argument("--trace", help="spot trace time_ms,add|remove,nodeNAME")
    r.add_argument("--compress", type=float, default=600.0, help="trace time divided by this factor")
    r.add_argument("--notice", type=float, default=120.0, help="preemption notice before a removal (s, trace time)")
    r.add_argument("--mode", choices=["live", "restart", "restart-forked"], default="live",
                   help="live handoffs; or the baseline, stop-and-restart through DCP with new processes as "
                        "fresh interpreters (restart) or forked from the agent's zygote (restart-forked)")
    r.add_argument("--model", default="tiny", help="preset: tiny, 1b, 3b")
    r.add_argument("--gpus", type=int, default=2, help="GPUs (processes) at the start")
    r.add_argument("--slots", type=int, default=None, help="GPUs this node can give (default: 4 on CPU)")
    r.add_argument("--parallel", default=None, help="first configuration tp,pp,dp (default: chosen)")
    r.add_argument("--steps", type=int, default=5000, help="train at most this many steps")
    r.add_argument("--end-after-events", type=int, default=20, metavar="N",
                   help="end N steps after the last event was handled (-1: run all --steps)")
    r.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    r.add_argument("--ckpt-every", type=int, default=10, help="periodic async checkpoint (0: off)")
    r.add_argument("--digest", nargs="?", const="step", choices=["step", "switch"], default=None,
                   help="state digests: after every step (default when given), or only right before "
                        "and after each handoff (large models)")
    r.add_argument("--budget-mib", type=int, default=512, help="staging budget B per rank")
    r.add_argument("--warmup-steps", type=int, default=2, help="mock-world warm-up steps of a joiner")
    r.add_argument("--warm", choices=["auto", "background", "boundary"], default="auto",
                   help="first collectives of the new groups: beside training (background), or all "
                        "members at one iteration boundary; auto (default): boundary on NCCL, "
                        "background on gloo")
    r.add_argument("--companion-share", type=float, default=0.0015,
                   help="at most this share of each training step goes to preparing the next "
                        "generation beside it (0: no limit; a deadline lifts it)")
    r.add_argument("--no-bind-cores", action="store_true",
                   help="CPU workers: leave them to the OS scheduler (default: each slot's worker bound "
                        "to cores of its own where the node has a core per slot)")
    r.add_argument("--memory-gib", type=float, default=None, help="per-GPU memory for target choice")
    r.add_argument("--token", default=None, help="control token (default: random, in control.json)")
    r.add_argument("--no-endpoint", action="store_true")
    r.add_argument("--run-dir", default=None)
    r.set_defaults(fn=_run)
    sc = sub.add_parser("scale", help="send an event to a running `liver run`")
    sc.add_argument("action", nargs="+", help="scale-out N [as P] | scale-in N [deadline Ds] [as P] | reshape P")
    sc.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    sc.add_argument("--url", default=None)
    sc.add_argument("--token", default=None)
    sc.set_defaults(fn=_scale)
    b = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bp = bsub.add_parser("plan", help="planner speed on GPT-3 175B at 1,024-2,048 ranks")
    bp.add_argument("--json", action="store_true")
    bp.add_argument("--repeats", type=int, default=3, help="best of N timings per scenario")
    bp.set_defaults(fn=_bench_plan)
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
    br.add_argument("--run-dir", default=None)
    br.set_defaults(fn=_bench_reconfig)
    bb = bsub.add_parser("boot", help="a cold joiner's cost before its Shadow World: fresh interpreter vs "
                                      "forked from the zygote")
    bb.add_argument("--json", action="store_true")
    bb.add_argument("--repeats", type=int, default=5, help="workers per way of starting (median taken)")
    bb.add_argument("--model", default="tiny", help="preset: tiny, 1b, 3b")
    bb.add_argument("--parallel", default="1,1,2", help="the joiner's configuration tp,pp,dp (rank 0)")
    bb.add_argument("--warmup-steps", type=int, default=2, help="mock-world warm-up steps")
    bb.add_argument("--run-dir", default=None)
    bb.set_defaults(fn=_bench_boot)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"liver: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job could not go on (ControllerError, a failed segment)
        print(f"liver: job failed: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
