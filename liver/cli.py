"""The ``liver`` command line. Its commands import what they use when they run: a command that
only talks to a running job (``status``, ``scale``, ``queue``, ``stop``) imports no torch."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from dataclasses import replace

from liver.bench import commands as bench
from liver.sim.commands import DEFAULT_TRACES, _bench_sim_speed, _sim_calibrate, _sim_project, _sim_run, _sim_validate



DEFAULT_EVENTS = """\
# the embedded schedule of `liver run` (and `make demo`): one event per line, see
# liver/controller/events.py for the grammar; "step +N": N steps after the event before it ended
at step 6: scale-out 4                 # two cold processes join; the controller picks tp,pp,dp
at step +6: reshape 2,2,1              # same four processes, new layout
at step +6: scale-in 2 deadline 20s    # preemption notice for two GPUs
"""


# `liver run` flags that set a job-file field (one owner: the field's dataclass has the default)
FLAG_FIELDS = {"model": "preset", "gpus": "gpus", "parallel": "parallel", "steps": "steps",
               "backend": "backend", "digest": "digest", "log_rank": "log_rank", "mode": "controller.mode",
               "end_after_events": "controller.end_after_events", "memory_gib": "controller.memory_gib",
               "ckpt_every": "checkpoint.every", "from_checkpoint": "checkpoint.start_from", "budget_mib": "transfer.budget_mib",
               "mock_steps": "prepare.mock_steps", "warm": "prepare.warm",
               "companion_share": "prepare.companion_share", "slots": "agent.slots",
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
        if flag in ("events", "trace"):
            value = str(Path(value).resolve())
        layers.append(nested(key, value))
    if args.no_bind_cores:
        layers.append({"agent": {"bind_cores": False}})
    if args.no_endpoint:
        layers.append({"controller": {"endpoint": False}})
    layers += [override(text) for text in args.set or ()]
    return load(args.config, layers)


def detected_slots(backend: str) -> int:
    if backend == "nccl":
        import torch
        return torch.cuda.device_count()
    return 4


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
    if state["phase"] is Phase.ENDED:
        raise ValueError(f"--resume {run_dir}: that job ended")
    cfg = state["cfg"]
    logs.setup()
    print(f"liver controller --resume: generation {state['gen']}, phase {state['phase'].value}, "
          f"{len(state['queue'])} queued, nodes {', '.join(n['name'] for n in state['nodes'])}; run dir {run_dir}",
          flush=True)
    report = run_job(cfg, [], run_dir, {"model": cfg.preset, "events_source": "resumed", "nodes": 0},
                     local_node=False, resume=state)
    print("\n" + rep.summary(report))
    return 1 if [e for e in report["events"] if e.get("digest_equal") is False] else 0


def _run(args: argparse.Namespace) -> int:
    from liver.controller import report as rep
    from liver.controller.admission import check_schedule
    from liver.controller.events import parse_schedule, parse_schedule_text, parse_trace
    from liver.controller.job import run_job

    from liver import logs
    from liver.config.fields import to_dict
    from liver.runtime.preload import check_threads

    if getattr(args, "resume", None):
        return _resume(args)
    nodes = args.nodes
    if args.cmd == "run" and not 1 <= nodes <= 64:
        raise ValueError(f"--nodes={nodes!r}: allowed 1 to 64 (agents on this machine)")
    cfg = run_config(args)
    if nodes == 0 and cfg.agent.slots is None:  # `liver controller`: the slots are the agents' to offer
        from liver.agent.config import MAX_SLOTS
        cfg = replace(cfg, agent=replace(cfg.agent, slots=MAX_SLOTS))
    cfg = cfg.with_slots(detected_slots(cfg.backend))
    if nodes > 1 and cfg.gpus > cfg.slots * nodes:
        raise ValueError(f"gpus={cfg.gpus}: allowed 1 to {cfg.slots * nodes} ({nodes} nodes of {cfg.slots} slots)")
    if nodes > 1:  # the schedule is checked against every node's slots
        cfg = replace(cfg, agent=replace(cfg.agent, slots=cfg.slots * nodes))
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
    bad = [e for e in report["events"] if e.get("digest_equal") is False]
    return 1 if bad else 0


def _endpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    """The running job's control endpoint and token: from --url/--token, or the run's control.json."""
    url, token = args.url, args.token
    if args.run_dir:
        info_path = Path(args.run_dir) / "control.json"
        try:
            info = json.loads(info_path.read_text())
            url, token = url or info["url"], token or info["token"]
        except FileNotFoundError:
            raise ValueError(f"--run-dir {args.run_dir}: no control.json there (not a run directory, or its "
                             "job has no control endpoint)") from None
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"--run-dir {args.run_dir}: control.json is unreadable or not the job's") from None
    if not url:
        raise ValueError("--run-dir or --url: the controller to talk to")
    return url, token


def _call(args: argparse.Namespace, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    from liver.controller.endpoint import request

    url, token = _endpoint(args)
    try:
        return request(url, token, method, path, body)
    except OSError as e:  # connection refused, timed out: the job has ended or is not reachable
        raise ValueError(f"the job's control endpoint at {url} does not answer ({e.__class__.__name__}: "
                         "the job may have ended)") from None


def _answer(code: int, body: dict, ok: tuple[int, ...]) -> int:
    """The job's answer: JSON on stdout; a refusal on stderr, with the job's reason, exit 1."""
    if code in ok:
        print(json.dumps(body))
        return 0
    print(f"liver: the job refused ({code}): {body.get('error', json.dumps(body))}", file=sys.stderr)
    return 1


def _status(args: argparse.Namespace) -> int:
    code, body = _call(args, "GET", "/status")
    if args.json or code != 200:
        return _answer(code, body, (200,))
    par = body.get("parallel") or {}
    print(f"{body['mode']}: phase {body['phase']}, generation {body['generation']}"
          + (f" (tp {par['tp']}, pp {par['pp']}, dp {par['dp']})" if par else "")
          + f", step {body['step']}, {body['queued']} queued")
    ck = body.get("checkpoint")
    if ck is not None:
        print("  checkpoint: " + (f"newest good of step {ck['step']}" if ck["step"] is not None else "none stands")
              + (f"; {ck['failures_in_a_row']} failed in a row since ({ck['error']})" if ck["failures_in_a_row"] else ""))
    for n in body.get("nodes", []):
        ranks = ", ".join(f"rank {r}: proc {p}" for r, p in n["ranks"]) or "no rank"
        print(f"  node {n['node']:<16} {'up' if n['up'] else 'LOST'}{' (notice)' if n['notice'] else ''}  "
              f"slots {n['slots'][0]}-{n['slots'][-1]}  {ranks}")
    return 0


def _agent(args: argparse.Namespace) -> int:
    import os

    from liver import logs
    from liver.agent.notices import watchers
    from liver.agent.service import AgentService
    from liver.runtime.preload import check_threads

    check_threads()  # (its workers' thread count: refused before any of them starts)
    url, token = args.controller, args.token or os.environ.get("LIVER_TOKEN")
    if args.run_dir and not url:
        url, token = _await_control(Path(args.run_dir), args.connect_timeout, token)
    if not url:
        raise ValueError("--controller HOST:PORT (or --run-dir of the controller's run): the controller to join")
    if not token:
        raise ValueError("--token (or LIVER_TOKEN): the job's token, from the controller's control.json")
    slots = args.slots or int(os.environ.get("LIVER_SLOTS", 0)) or detected_slots(args.backend)
    node = args.node or os.environ.get("LIVER_NODE") or os.environ.get("SLURMD_NODENAME") \
        or os.environ.get("HOSTNAME") or None
    logs.setup()
    svc = AgentService(url, token, slots, node=node, connect_timeout_s=args.connect_timeout, quiet=not args.verbose)
    svc.notices = watchers(args)  # (started once every flag was checked)
    return svc.run()


def _await_control(run_dir: Path, timeout_s: float, token: str | None) -> tuple[str, str]:
    """The controller's URL and token from its run directory's control.json, once it is there."""
    import time

    end = time.time() + timeout_s
    while True:
        try:
            info = json.loads((run_dir / "control.json").read_text())
            return info["url"], token or info["token"]
        except (OSError, ValueError, KeyError, TypeError):
            if time.time() > end:
                raise ValueError(f"--run-dir {run_dir}: no controller's control.json there within {timeout_s:g} s") \
                    from None
            time.sleep(0.2)


def _stop(args: argparse.Namespace) -> int:
    return _answer(*_call(args, "POST", "/end", {"after": args.after}), (202,))


def _scale(args: argparse.Namespace) -> int:
    return _answer(*_call(args, "POST", "/scale", {"action": " ".join(args.action)}), (202,))


def _queue(args: argparse.Namespace) -> int:
    if args.withdraw is not None:
        code, body = _call(args, "POST", "/withdraw", {"position": args.withdraw})
    else:
        code, body = _call(args, "GET", "/queue")
    return _answer(code, body, (200, 202))


def _data_prepare(args: argparse.Namespace) -> int:
    from liver.data.prepare import prepare

    meta = prepare(args.files, args.out)
    print(f"{args.out}: {meta['tokens']:,} tokens ({meta['tokenizer']}, vocabulary {meta['vocab_size']}) from "
          f"{meta['file_count']} files; train on it with --set job.train.data={args.out}")
    return 0


def _job_flags(r: argparse.ArgumentParser) -> None:
    """The flags of a job (`liver run`, `liver controller`)."""
    r.add_argument("--config", default=None, metavar="FILE", help="a job file (TOML, see configs/)")
    r.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                   help="set any field of the job, e.g. --set job.model.num_layers=8 (repeatable)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--events", help="schedule file (default: the embedded schedule)")
    src.add_argument("--trace", help="spot trace time_ms,add|remove,nodeNAME")
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
    r.add_argument("--warm", help="first collectives of the new groups: beside training (background), or all "
                                  "members at one iteration boundary; auto (default): boundary on NCCL, "
                                  "background on gloo")
    r.add_argument("--companion-share", type=float,
                   help="at most this share of each training step goes to preparing the next "
                        "generation beside it (0: no limit; a deadline lifts it; default 0.0015)")
    r.add_argument("--no-bind-cores", action="store_true",
                   help="CPU workers: leave them to the OS scheduler (default: each slot's worker bound "
                        "to cores of its own where the node has a core per slot)")
    r.add_argument("--memory-gib", type=float, help="per-GPU memory for target choice")
    r.add_argument("--token", default=None, help="control token (default: random, in control.json)")
    r.add_argument("--no-endpoint", action="store_true")
    r.add_argument("--run-dir", default=None)


def describe_model(cfg) -> str:
    """The model that runs, as the job gives it (its engine, shape and parameters counted from its
    state), not the preset it started from."""
    m = cfg.job.model
    params = sum(s.numel for s in cfg.adapter.state_specs(cfg.job) if s.kind == "param")
    return (f"{cfg.adapter.name} ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, ffn "
            f"{m.ffn_size}, vocab {m.vocab_size}, seq {m.seq_len}: {params:,} parameters)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="liver", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train and reconfigure live (the main job)",
                       description="Flags set fields of the job (configs/*.toml: --config); unset flags leave "
                                   "the file's value, or the field's default.")
    _job_flags(r)
    r.add_argument("--nodes", type=int, default=1, help="node agents on this machine, each a process of its own "
                   "with --slots slots (default 1: the agent inside this process)")
    r.set_defaults(fn=_run)
    c = sub.add_parser("controller", help="the job's controller alone: node agents (liver agent) join it",
                       description="As `liver run`, but the workers run on the nodes whose agents register.")
    _job_flags(c)
    c.add_argument("--host", help="address the endpoint and the job's store listen on (default 127.0.0.1; "
                                  "0.0.0.0: every interface)")
    c.add_argument("--port", type=int, help="the endpoint's port (the store takes the next; default: any free)")
    c.add_argument("--on-join", help="a node that registers mid-run: now (default), better, never")
    c.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="instead: go on with the job of RUN_DIR whose controller died (its journal.pkl); "
                        "the endpoint listens where it did, the agents find it again")
    c.set_defaults(fn=_run, nodes=0)
    a = sub.add_parser("agent", help="a node agent: offers this node's slots to a job's controller")
    a.add_argument("--controller", default=None, metavar="HOST:PORT", help="the controller's endpoint")
    a.add_argument("--run-dir", default=None, help="instead: the controller's run directory (its control.json)")
    a.add_argument("--token", default=None, help="the job's token (default: LIVER_TOKEN, or control.json)")
    a.add_argument("--slots", type=int, default=None,
                   help="worker slots (default: LIVER_SLOTS, or the GPU count on NCCL, 4 on CPU)")
    a.add_argument("--backend", default="gloo", help="where --slots is unset: nccl counts the GPUs")
    a.add_argument("--node", default=None, help="this node's name in the job (default: LIVER_NODE, "
                                                "SLURMD_NODENAME, HOSTNAME, or host-pid)")
    a.add_argument("--connect-timeout", type=float, default=300.0, help="seconds to wait for the controller")
    a.add_argument("--verbose", action="store_true", help="worker output to the terminal too")
    from liver.agent.notices import add_flags
    add_flags(a)
    a.set_defaults(fn=_agent)
    st = sub.add_parser("status", help="a running job: its phase, generation, nodes and which ranks they hold")
    st.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    st.add_argument("--url", default=None)
    st.add_argument("--token", default=None)
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=_status)
    so = sub.add_parser("stop", help="end a running job after N more steps (an event in flight finishes first)")
    so.add_argument("--after", type=int, default=0, metavar="N", help="steps to train before the end (default 0)")
    so.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    so.add_argument("--url", default=None)
    so.add_argument("--token", default=None)
    so.set_defaults(fn=_stop)
    sc = sub.add_parser("scale", help="send an event to a running `liver run`")
    sc.add_argument("action", nargs="+", help="scale-out N [as P] | scale-in N [deadline Ds] [as P] | reshape P")
    sc.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    sc.add_argument("--url", default=None)
    sc.add_argument("--token", default=None)
    sc.set_defaults(fn=_scale)
    q = sub.add_parser("queue", help="list the events a running `liver run` has queued, or withdraw one")
    q.add_argument("--withdraw", type=int, default=None, metavar="N", help="take back the N-th queued event")
    q.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    q.add_argument("--url", default=None)
    q.add_argument("--token", default=None)
    q.set_defaults(fn=_queue)
    dt = sub.add_parser("data", help="training data: a corpus for job.train.data")
    dsub = dt.add_subparsers(dest="data", required=True)
    dp = dsub.add_parser("prepare", help="local text files (or directories of them) as one byte-level token file")
    dp.add_argument("files", nargs="+", metavar="FILES")
    dp.add_argument("--out", required=True, metavar="DIR")
    dp.set_defaults(fn=_data_prepare)
    sm = sub.add_parser("sim", help="the calibrated simulator of elastic training (liver/sim)")
    ssub = sm.add_subparsers(dest="sim", required=True)
    sr = ssub.add_parser("run", help="one job under a trace, a schedule or a volatility regime, by policy")
    sr.add_argument("--model", default="14b", help="1b, 3b, 7b, 14b, 30b, 70b, 175b")
    sr.add_argument("--profile", default="h200", help="h200 (calibrated) or a800-pcie")
    sr.add_argument("--gpus", type=int, default=32, help="GPUs at the start (schedule, regime)")
    src2 = sr.add_mutually_exclusive_group()
    src2.add_argument("--trace", help="a spot trace (time_ms,add|remove,nodeNAME)")
    src2.add_argument("--events", help="a schedule file (time triggers)")
    sr.add_argument("--gpus-per-node", type=int, default=1, help="GPUs of a trace's node")
    sr.add_argument("--interval-min", type=float, default=10.0, help="regime: mean minutes between events")
    sr.add_argument("--notice-s", type=float, default=120.0, help="a loss's notice (s)")
    sr.add_argument("--hours", type=float, default=8.0)
    sr.add_argument("--seed", type=int, default=0)
    sr.add_argument("--policy", default="all", help="live, restart-storage, restart-memory, dp-only, all")
    sr.add_argument("--json", action="store_true")
    sr.set_defaults(fn=_sim_run)
    sc2 = ssub.add_parser("calibrate", help="fit the H200 profile to bench/results (writes liver/sim/calibration.json)")
    sc2.add_argument("--results", default="bench/results")
    sc2.add_argument("--out", default=str(Path(__file__).parent / "sim" / "calibration.json"))
    sc2.add_argument("--check", action="store_true", help="only check that the file is what the results give")
    sc2.set_defaults(fn=_sim_calibrate)
    sv = ssub.add_parser("validate", help="leave-one-out: each measured event against the fit of the others")
    sv.add_argument("--results", default="bench/results")
    sv.add_argument("--json", action="store_true", help="every event, not only the summary")
    sv.set_defaults(fn=_sim_validate)
    sp = ssub.add_parser("project", help="a projection, JSON and PNG: downtime, prepare or goodput")
    sp.add_argument("what", choices=["downtime", "prepare", "goodput"])
    sp.add_argument("--out", required=True)
    sp.add_argument("--traces", default=str(DEFAULT_TRACES),
                    help="the folder of p3-trace.csv and g4dn-trace.csv (default: the repository's traces/bamboo)")
    sp.add_argument("--model", default="14b", help="goodput: the model")
    sp.add_argument("--gpus", type=int, default=32, help="goodput: the regimes' GPUs")
    sp.add_argument("--seeds", type=int, default=5, help="goodput: runs of each regime")
    sp.set_defaults(fn=_sim_project)
    b = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bp = bsub.add_parser("plan", help="planner speed on GPT-3 175B at 1,024-2,048 ranks")
    bp.add_argument("--json", action="store_true")
    bp.add_argument("--repeats", type=int, default=3, help="best of N timings per scenario")
    bp.add_argument("--pickle", action="store_true",
                    help="instead: CPU time of reading the controller's plan against planning again")
    bp.set_defaults(fn=bench.bench_plan)
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
    br.set_defaults(fn=bench.bench_reconfig)
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
    bh.add_argument("--warm", default="auto", choices=["auto", "background", "boundary"])
    bh.add_argument("--budget-mib", type=int, default=512, help="staging budget B per rank")
    bh.add_argument("--cycles", type=int, default=4, help="x2-cycles: rounds of its four events")
    bh.add_argument("--gap", type=int, default=12, help="x2-cycles: steps between events")
    bh.add_argument("--live-only", action="store_true", help="no restart run (the overhead over many events)")
    bh.add_argument("--run-root", default=None, help="run directories here (e.g. /dev/shm); default: --out")
    bh.add_argument("--out", required=True, help="results: handoffs.json, reports, timelines")
    bh.set_defaults(fn=bench.bench_handoffs)
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
    bn.set_defaults(fn=bench.bench_nodes)
    bt = bsub.add_parser("transfer", help="the streaming executor alone on 2 GPUs: tp1 -> tp2 of a 0.6B and a 1.1B state")
    bt.add_argument("--out", required=True)
    bt.add_argument("--budget-mib", type=int, default=512, help="staging budget B per rank")
    bt.set_defaults(fn=bench.bench_transfer)
    bc = bsub.add_parser("core-binding", help="CPU step times with workers bound to their slots' cores and not")
    bc.add_argument("--json", action="store_true")
    bc.add_argument("--repeats", type=int, default=3, help="interleaved runs of each")
    bc.add_argument("--steps", type=int, default=800, help="steps per run")
    bc.add_argument("--run-dir", default=None)
    bc.set_defaults(fn=bench.bench_core_binding)
    bm = bsub.add_parser("measured", help="the README's Measured section from bench/results (claims.toml)")
    bm.add_argument("--write", action="store_true", help="rewrite the section (default: only check it)")
    bm.set_defaults(fn=bench.bench_measured)
    bb = bsub.add_parser("boot", help="a cold joiner's cost before its Shadow World: fresh interpreter vs "
                                      "forked from the zygote")
    bb.add_argument("--json", action="store_true")
    bb.add_argument("--repeats", type=int, default=5, help="workers per way of starting (median taken)")
    bb.add_argument("--model", default="tiny", help="preset: tiny, 1b, 3b")
    bb.add_argument("--parallel", default="1,1,2", help="the joiner's configuration tp,pp,dp (rank 0)")
    bb.add_argument("--warmup-steps", type=int, default=2, help="mock-world warm-up steps")
    bb.add_argument("--run-dir", default=None)
    bb.set_defaults(fn=bench.bench_boot)
    bhe = bsub.add_parser("heal", help="a replica killed: healed from the survivor vs recovered from the checkpoint")
    bhe.add_argument("--repeats", type=int, default=3)
    bhe.add_argument("--ckpt-every", type=int, default=10)
    bhe.add_argument("--kill-after", type=int, default=6, help="steps past a checkpoint at which the kill lands")
    bhe.add_argument("--steps", type=int, default=60)
    bhe.add_argument("--run-dir", default=None)
    bhe.set_defaults(fn=bench.bench_heal)
    bso = bsub.add_parser("soak", help="random events (every kind, kills, hangs, notices, overlaps) on a CPU job, "
                                       "checked for digest parity and step continuity")
    bso.add_argument("--events", type=int, default=100)
    bso.add_argument("--seed", type=int, default=1)
    bso.add_argument("--slots", type=int, default=4, help="processes the job may use")
    bso.add_argument("--ckpt-every", type=int, default=5)
    bso.add_argument("--replays", type=int, default=3, help="recoveries replayed by restart and compared step by step")
    bso.add_argument("--run-dir", default=None)
    bso.add_argument("--out", default=None, metavar="FILE", help="the whole result, with the driver's log, as JSON")
    bso.set_defaults(fn=bench.bench_soak)
    bta = bsub.add_parser("target", help="every valid configuration timed on CPU against the controller's choice")
    bta.add_argument("--counts", default="2-8", help="process counts, e.g. 2-8")
    bta.add_argument("--steps", type=int, default=25, help="steps per configuration")
    bta.add_argument("--run-dir", default=None)
    bta.set_defaults(fn=bench.bench_target)
    bss = bsub.add_parser("sim-speed", help="the simulator's CPU time for an 8-hour trace at 1,024 GPUs")
    bss.add_argument("--trace", required=True, help="a spot trace (p3: 32 nodes at its peak)")
    bss.add_argument("--gpus-per-node", type=int, default=32)
    bss.add_argument("--model", default="70b")
    bss.set_defaults(fn=_bench_sim_speed)
    bd = bsub.add_parser("dcp", help="one device: a model's step time, DCP save and load of its state to each directory")
    bd.add_argument("--model", action="append", help="a preset (repeat the flag for several; default 1b)")
    bd.add_argument("--dir", action="append", help="where to write (repeat: local disk, /dev/shm; default the temp dir)")
    bd.add_argument("--repeats", type=int, default=3)
    bd.add_argument("--steps", type=int, default=8)
    bd.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    bd.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                    help="a field of each model's job beyond its preset, e.g. job.model.hidden_size=1024 (repeatable)")
    bd.add_argument("--out", required=True)
    bd.set_defaults(fn=bench.bench_dcp)
    bbu = bsub.add_parser("build", help="the engine construction a switch does before its transfer, native "
                                        "against reference, rank 0 of each layout over a mock world")
    bbu.add_argument("--engine", default="examples/llama.py:RECIPE", metavar="FILE:RECIPE")
    bbu.add_argument("--model", default="1b", help="the preset whose shape is built (default 1b)")
    bbu.add_argument("--parallel", action="append", metavar="TP,PP,DP",
                     help="a layout (repeatable; default 1,1,4 2,1,2 4,1,1)")
    bbu.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE")
    bbu.add_argument("--repeats", type=int, default=3)
    bbu.add_argument("--json", action="store_true")
    bbu.set_defaults(fn=bench.bench_build)
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
    bo.set_defaults(fn=bench.bench_overhead)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"liver: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job could not go on (ControllerError)
        print(f"liver: job failed: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # before the job started, or after it ended
        print("liver: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
