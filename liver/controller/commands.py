"""``liver run`` and ``liver controller``: a job's flags, its checked configuration, and the job run
to its end with its report (``liver.controller.job``). Registered by ``add_parsers``; the modules of
the job are imported when the command runs."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from liver.host import gpus as host_gpus

DEFAULT_EVENTS = """\
# the embedded schedule of `liver run` (and `make demo`): one event per line, see
# liver/policy/events.py for the grammar; "step +N": N steps after the event before it ended
at step 6: scale-out 4                 # two cold processes join; the controller picks tp,pp,dp
at step +6: reshape 2,2,1              # same four processes, new layout
at step +6: scale-in 2 deadline 20s    # preemption notice for two GPUs
"""


# `liver run` flags that set a job-file field (one owner: the field's dataclass has the default)
FLAG_FIELDS = {"model": "preset", "gpus": "gpus", "parallel": "parallel", "steps": "steps",
               "backend": "backend", "digest": "digest", "log_rank": "log_rank", "mode": "controller.mode",
               "end_after_events": "controller.end_after_events", "memory_gib": "controller.memory_gib",
               "ckpt_every": "checkpoint.every", "from_checkpoint": "checkpoint.start_from", "budget_mib": "transfer.budget_mib",
               "mock_steps": "prepare.mock_steps", "connect": "prepare.connect",
               "companion_share": "prepare.companion_share", "precopy": "prepare.precopy", "slots": "agent.slots",
               "events": "events.schedule", "trace": "events.trace", "compress": "events.compress",
               "notice": "events.notice_s", "host": "controller.host", "port": "controller.port",
               "on_join": "controller.on_join"}


def run_config(args: argparse.Namespace):
    """The job file (if any), then each flag given, then each ``--set``: a checked RunConfig."""
    from liver.config.jobfile import load, nested, override

    layers = []
    for flag, key in FLAG_FIELDS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if flag in ("events", "trace"):  # (the one source of events: it replaces the job file's other one)
            other = "events.trace" if flag == "events" else "events.schedule"
            layers.append(nested(other, None))
            value = str(Path(value).resolve())
        layers.append(nested(key, value))
    if args.no_bind_cores:
        layers.append({"agent": {"bind_cores": False}})
    if args.no_endpoint:
        layers.append({"controller": {"endpoint": False}})
    layers += [override(text) for text in args.set or ()]
    return load(args.config, layers)


def _resume(args: argparse.Namespace) -> int:
    """``liver controller --resume RUN_DIR``: the controller of a job whose controller died."""
    from liver import logs
    from liver.controller import journal
    from liver.controller import report as rep
    from liver.controller.job import run_job
    from liver.controller.phases import Phase

    run_dir = Path(args.resume)
    state = journal.read(run_dir)
    if state["mode"] != "live":
        raise ValueError(f"--resume {run_dir}: a {state['mode']!r} job cannot be resumed (only live mode's)")
    s = state["state"]
    if s.phase is Phase.ENDED:
        raise ValueError(f"--resume {run_dir}: that job ended")
    cfg = state["cfg"]
    # on another node (the controller's was lost): where it listens now; the agents find it through
    # the run directory (control.json), which it writes anew
    where = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if where:
        ctl = replace(cfg.controller, **where)
        if args.host is not None and cfg.controller.advertise:
            ctl = replace(ctl, advertise=None)  # (the old node's name: --set it anew if needed)
        cfg = replace(cfg, controller=ctl)
        state["url"] = None  # (not where the old one listened)
    logs.setup()
    print(f"liver controller --resume: generation {s.gen}, phase {s.phase.value}, {len(s.queue)} queued, nodes {', '.join(n['name'] for n in state['nodes'])}; run dir {run_dir}",
          flush=True)
    report = run_job(cfg, [], run_dir, {"model": cfg.preset, "events_source": "resumed", "nodes": 0},
                     local_node=False, resume=state)
    print("\n" + rep.summary(report))
    return 1 if [e for e in report["events"] if e.get("digest_equal") is False or e.get("digest_error")] else 0


def run_command(args: argparse.Namespace) -> int:
    from liver.controller import report as rep
    from liver.controller.admission import check_schedule
    from liver.policy.events import parse_schedule, parse_schedule_text, parse_trace
    from liver.controller.job import run_job

    from liver import logs
    from liver.config.fields import to_dict
    from liver.host.threads import check_threads

    if getattr(args, "resume", None):
        return _resume(args)
    nodes = args.nodes
    if args.cmd == "run" and not 1 <= nodes <= 64:
        raise ValueError(f"--nodes={nodes!r}: allowed 1 to 64 (agents on this machine)")
    per_node = getattr(args, "slots", None)
    if nodes > 1 and per_node:  # --slots is each node's: the job's are every node's together
        args = argparse.Namespace(**{**vars(args), "slots": per_node * nodes})
    cfg = run_config(args)
    if nodes == 0 and cfg.agent.slots is None:  # `liver controller`: the slots are the agents' to offer
        from liver.agent.config import MAX_SLOTS
        cfg = replace(cfg, agent=replace(cfg.agent, slots=MAX_SLOTS))
    cfg = cfg.with_slots(host_gpus.slots(cfg.backend) * max(1, nodes))  # (every node's, on --nodes K)
    if nodes > 1 and cfg.gpus > cfg.slots:
        raise ValueError(f"gpus={cfg.gpus}: allowed 1 to {cfg.slots} ({nodes} nodes of {cfg.slots // nodes} slots)")
    src = cfg.events
    if src.trace:
        events = parse_trace(src.trace, slots=cfg.slots, compress=src.compress, notice_s=src.notice_s)
        gpus = events.pop(0).gpus
        if cfg.parallel is not None and cfg.parallel.world_size != gpus:
            raise ValueError(f"parallel={cfg.parallel.short()}: tp*pp*dp={cfg.parallel.world_size} but the trace "
                             f"starts with {gpus} GPUs")
        cfg = replace(cfg, gpus=gpus)
    elif src.schedule:
        events = parse_schedule(src.schedule)
    elif nodes == 0:  # `liver controller`: events come from its nodes and its endpoint
        events = []
    else:
        events = parse_schedule_text(DEFAULT_EVENTS, "embedded schedule")
    check_schedule(cfg, events)  # refused here, before anything of the job exists
    check_threads()
    if cfg.checkpoint.start_from is not None:  # the one checkpoint it names, matching the job's model
        from liver.checkpoint.periodic import check_matches, resolve
        cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, start_from=resolve(cfg.checkpoint.start_from)))
        check_matches(cfg.checkpoint.start_from, cfg.adapter.state_specs(cfg.job))
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix=f"liver-run-{cfg.controller.mode}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (src.trace or src.schedule) and nodes:
        (run_dir / "events.txt").write_text(DEFAULT_EVENTS)
    (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    logs.setup()
    model = describe_model(cfg)
    print(f"liver run --mode {cfg.controller.mode}: model {model}, "
          f"{cfg.gpus} of {cfg.slots} slots, {cfg.steps} steps, {len(events)} events, backend {cfg.backend}, "
          f"run dir {run_dir}", flush=True)
    meta = {"model": cfg.preset, "model_description": model, "events_source": str(src.trace or src.schedule or "embedded"), "nodes": nodes}
    if nodes > 1:
        from liver.agent.local import local_agents
        with local_agents(run_dir, nodes, cfg.slots // nodes, args.token):
            report = run_job(cfg, events, run_dir, meta, token=args.token, local_node=False)
    else:
        report = run_job(cfg, events, run_dir, meta, token=args.token, local_node=nodes == 1)
    print("\n" + rep.summary(report))
    drawn = cfg.timeline and "timeline_not_drawn" not in report
    print(f"report: {run_dir / 'report.json'}" + (f"\ntimeline: {run_dir / 'timeline.png'}" if drawn else "")
          + (f"\ntimeline: not drawn: {report['timeline_not_drawn']}" if "timeline_not_drawn" in report else ""))
    if report.get("interrupted"):
        print(f"liver: interrupted (Ctrl-C) at step {report['steps'][-1]['step'] if report['steps'] else 0}; "
              f"every process stopped, report written", file=sys.stderr)
        return 130
    bad = [e for e in report["events"] if e.get("digest_equal") is False or e.get("digest_error")]
    return 1 if bad else 0


def job_flags(r: argparse.ArgumentParser) -> None:
    """The flags of a job (`liver run`, `liver controller`)."""
    r.add_argument("--config", default=None, metavar="FILE", help="a job file (TOML, see configs/)")
    r.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                   help="set any field of the job, e.g. --set job.model.num_layers=8 (repeatable)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--events", help="schedule file (default: the embedded schedule)")
    src.add_argument("--trace", help="spot trace: Bamboo's lines (time_ms,add|remove,nodeNAME) or SkyPilot's JSON "
                                     "(gap_seconds, instances a tick)")
    r.add_argument("--compress", type=float, help="trace time divided by this factor (default 600)")
    r.add_argument("--notice", type=float, help="preemption notice before a removal (s, trace time; default 120)")
    r.add_argument("--mode", help="live (default) handoffs; or the baseline, stop-and-restart through DCP with new "
                                  "processes as fresh interpreters (restart) or forked from the agent's zygote "
                                  "(restart-forked)")
    r.add_argument("--model", help="the named job the model starts from: tiny (default), tiny8, 1b, 3b, 7b")
    r.add_argument("--gpus", type=int, help="GPUs (processes) at the start (default 2)")
    r.add_argument("--slots", type=int, help="GPUs this node can give (default: the GPU count on NCCL, 4 on CPU)")
    r.add_argument("--parallel", help="first configuration tp,pp,dp[:l0/l1/..] (default: chosen)")
    r.add_argument("--steps", type=int, help="train at most this many steps (default 5000)")
    r.add_argument("--end-after-events", type=int, metavar="N",
                   help="end N steps after the last event was handled (-1: run all --steps; default 20)")
    r.add_argument("--backend", help="gloo (default) or nccl")
    r.add_argument("--ckpt-every", type=int, help="periodic async checkpoint every K steps (0: off; default 10)")
    r.add_argument("--from-checkpoint", help="start from a checkpoint (an earlier run's RUN_DIR/ckpt: its newest "
                                             "whole one; or one checkpoint's directory), on any layout")
    r.add_argument("--digest", nargs="?", const="step",
                   help="state digests: after every step (default when given), or only right before "
                        "and after each handoff (switch: large models)")
    r.add_argument("--log-rank", type=int, help="the rank whose step line is printed (default 0; -1: every rank)")
    r.add_argument("--budget-mib", type=int, help="staging budget B per rank (MiB, default 512)")
    r.add_argument("--mock-steps", "--warmup-steps", dest="mock_steps", type=int,
                   help="a cold joiner's training steps on its mock world (default 2)")
    r.add_argument("--connect", help="first collectives of the new groups: beside training (background), or all "
                                  "members at one iteration boundary; auto (default): boundary on NCCL, "
                                  "background on gloo")
    r.add_argument("--companion-share", type=float,
                   help="at most this share of each training step goes to preparing the next "
                        "generation beside it (0: no limit; a deadline lifts it; default 0.0015)")
    r.add_argument("--precopy", action="store_const", const=True, default=None,
                   help="copy the state that moves between old ranks before the switch and keep it current "
                        "by replaying each step's update there: the pause moves only the rest (default: off)")
    r.add_argument("--no-bind-cores", action="store_true",
                   help="CPU workers: leave them to the OS scheduler (default: each slot's worker bound "
                        "to cores of its own where the node has a core per slot)")
    r.add_argument("--memory-gib", type=float, help="per-GPU memory for target choice")
    r.add_argument("--token", default=None, help="control token (default: random, in control.json)")
    r.add_argument("--no-endpoint", action="store_true")
    r.add_argument("--run-dir", default=None)


def describe_model(cfg) -> str:
    """The model that runs, as the job gives it (its engine, its configuration's own description,
    ``describe()``, else its fields, and its parameters as its engine counts them), not the preset
    it started from."""
    import dataclasses

    m = cfg.job.model
    shape = m.describe() if hasattr(m, "describe") else \
        ", ".join(f"{f.name} {getattr(m, f.name)}" for f in dataclasses.fields(m))
    return f"{cfg.adapter.name} ({shape}: {cfg.adapter.facts(cfg.job).params:,} parameters)"



def add_parsers(sub) -> None:
    """``liver run`` (the main job) and ``liver controller`` (its controller alone)."""
    r = sub.add_parser("run", help="train and reconfigure live (the main job)",
                       description="Flags set fields of the job (configs/*.toml: --config); unset flags leave "
                                   "the file's value, or the field's default.")
    job_flags(r)
    r.add_argument("--nodes", type=int, default=1, help="node agents on this machine, each a process of its own "
                   "with --slots slots (default 1: the agent inside this process)")
    r.set_defaults(fn=run_command)
    c = sub.add_parser("controller", help="the job's controller alone: node agents (liver agent) join it",
                       description="As `liver run`, but the workers run on the nodes whose agents register.")
    job_flags(c)
    c.add_argument("--host", help="address the endpoint and the job's store listen on (default 127.0.0.1; "
                                  "0.0.0.0: every interface)")
    c.add_argument("--port", type=int, help="the endpoint's port (the store takes the next; default: any free)")
    c.add_argument("--on-join", help="a node that registers mid-run: now (default), better, never")
    c.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="instead: go on with the job of RUN_DIR whose controller died (its journal.pkl); "
                        "the endpoint listens where it did (or at --host/--port: on another node), the agents "
                        "find it again")
    c.set_defaults(fn=run_command, nodes=0)


__all__ = ["DEFAULT_EVENTS", "add_parsers", "describe_model", "run_config"]
