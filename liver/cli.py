"""The ``liver`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from liver.topology import JobConfig, ModelConfig, ParallelConfig, TrainConfig

DEMO_JOB = JobConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_heads=4, ffn_size=128,
                                       vocab_size=256, seq_len=32),
                     train=TrainConfig(global_batch=8, micro_batch=2, warmup_steps=5))


def _demo(args: argparse.Namespace) -> int:
    from liver.runtime.restart import stop_and_restart

    configs = [ParallelConfig.parse(c) for c in args.configs]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="liver-demo-"))
    print(f"LiveR demo: {DEMO_JOB.model.num_params():,} parameters, configurations "
          f"{' -> '.join(c.short() for c in configs)}, {args.steps} steps each, work dir {workdir}")
    out = stop_and_restart(job=DEMO_JOB, configs=configs, steps=args.steps, workdir=workdir)
    for ev in out["events"]:
        print(f"\nstop-and-restart {ev['old']} -> {ev['new']}: downtime {ev['downtime_s']:.2f} s "
              f"(state digest {'equal' if ev['digest_equal'] else 'DIFFERENT'} across the restart)")
        for k in ("save_s", "stop_s", "process_start_s", "group_init_s", "load_s", "warmup_s"):
            print(f"  {k[:-2]:<14} {ev[k]:7.3f} s")
    (workdir / "report.json").write_text(json.dumps(out, indent=1))
    print(f"\nreport: {workdir / 'report.json'}")
    return 0 if all(ev["digest_equal"] for ev in out["events"]) else 1


def _bench_plan(args: argparse.Namespace) -> int:
    from liver.bench.plan import run

    rows = run(repeats=args.repeats)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['scenario']:<60} tasks {r['num_tasks']:>8,}  moved {r['bytes_moved'] / 1e12:7.2f} TB "
                  f"(identity placement {r['bytes_moved_identity_placement'] / 1e12:7.2f} TB)  "
                  f"plan {r['plan_s']:.3f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="liver", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="train on 4 CPU processes, reshape, continue")
    d.add_argument("--configs", nargs="+", default=["2,2,1", "1,2,2"],
                   help="configurations as tp,pp,dp (each one a generation)")
    d.add_argument("--steps", type=int, default=8)
    d.add_argument("--workdir", default=None)
    d.set_defaults(fn=_demo)
    b = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bp = bsub.add_parser("plan", help="planner speed on GPT-3 175B at 1,024-2,048 ranks")
    bp.add_argument("--json", action="store_true")
    bp.add_argument("--repeats", type=int, default=3, help="best of N timings per scenario")
    bp.set_defaults(fn=_bench_plan)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"liver: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
