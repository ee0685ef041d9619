"""``liver bench nodes``: two node agents on this machine (one GPU each, or one CPU slot each on
gloo) under one ``liver controller``: a preemption notice to node1 (its rank leaves within the
deadline), node1's agent gone, then node1 back (a new agent registers: scale-out onto it). The
same, live and by stop-and-restart through DCP, one after the other in one call.

    liver bench nodes --model 1b --backend nccl --out OUT
    liver bench nodes --model tiny --backend gloo --out OUT      # CPU dry run
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from liver.agent.local import node_devices, start_agent, stop_agent
from liver.bench.handoffs import job_layers
from liver.config.jobfile import build
from liver.controller.endpoint import request
from liver.engine.interface import absolute_engine_path
from liver.host import netns
from liver.topology.presets import PRESETS

KEYS = ("old", "new", "outcome", "status", "downtime_s", "switch_s", "transfer_s", "prepare_s", "digest_equal",
        "deadline_met", "peak_extra_bytes", "save_s", "load_s", "process_start_s")


class LocalJob:
    """A ``liver controller`` and its node agents on this machine, each a process tree of its own,
    in one run directory (this bench, and the tests of several nodes). Where this machine can
    make network namespaces (``liver.host.netns``), the controller and each agent run in one of
    their own, each with its own address on a bridge: nothing crosses nodes over loopback, and
    the workers' gloo and NCCL connections use the node's interface (``--iface``). Elsewhere (or
    ``network=False``) all run on loopback, and ``loopback_why`` says why."""

    def __init__(self, run_dir: Path, controller_args: list[str], backend: str = "gloo",
                 network: bool = True, controller_env: dict[str, str] | None = None) -> None:
        """``controller_env``: added to the first controller's environment (a fault to arm)."""
        self.run_dir, self.backend = run_dir, backend
        self.net: netns.Network | None = None
        self.loopback_why = "asked for" if not network else netns.unavailable()
        if self.loopback_why is None:
            self.net = netns.Network()
        else:
            print(f"[liver] nodes on loopback, no network namespaces: {self.loopback_why}", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (run_dir / "control.json").unlink()  # (a run before's would mislead the agents)
        self.log = open(run_dir / "controller.log", "ab")
        self.agents: dict[str, subprocess.Popen] = {}
        self._controller(["--run-dir", str(run_dir),
                          *(["--host", self.net.node("controller").addr] if self.net else []), *controller_args],
                         controller_env or {})
        end = time.time() + 120
        while not (run_dir / "control.json").exists():
            if self.proc.poll() is not None or time.time() > end:
                raise RuntimeError(f"no control endpoint from the controller:\n{self.tail()}")
            time.sleep(0.1)
        info = json.loads((run_dir / "control.json").read_text())
        self.url, self.token = info["url"], info["token"]

    def _controller(self, args: list[str], env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "liver.cli", "controller", *args]
        self.proc = subprocess.Popen(self.net.node("controller").command(argv) if self.net else argv,
                                     env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def resume(self) -> None:
        """``liver controller --resume`` on the run, where the controller ran (its address kept)."""
        self._controller(["--resume", str(self.run_dir)])

    def node(self, name: str) -> netns.Node | None:
        """Node ``name``'s network namespace (None on loopback)."""
        return self.net.node(name) if self.net else None

    def agent(self, name: str, *extra: str, index: int | None = None) -> None:
        """Agent ``name`` of one slot; ``index``: on NCCL, its GPU is this machine's ``index``-th.
        On NCCL each node is a host of its own to NCCL (``NCCL_HOSTID``: its name), as the machine
        it stands for would be: NCCL joins its ranks over the network, not by the peer-to-peer
        and shared-memory paths of one host, and two nodes may share one GPU (a correctness run:
        NCCL refuses two ranks of one host on one GPU)."""
        devices = node_devices(index, 1, os.environ.get("CUDA_VISIBLE_DEVICES")) \
            if index is not None and self.backend == "nccl" else None
        where = self.node(name)
        self.agents[name] = start_agent(self.run_dir, name, 1, extra=(*extra, *(("--iface", netns.IFACE) if where else ())),
                                        devices=devices, wrap=where.command if where else None,
                                        env={"NCCL_HOSTID": name} if self.backend == "nccl" else None)

    def status(self) -> dict:
        try:
            return request(self.url, self.token, "GET", "/status")[1]
        except OSError:  # (a controller starting again: not listening yet)
            return {"phase": None, "step": 0, "parallel": None, "nodes": []}

    def wait(self, cond, what: str, timeout: float = 150.0) -> dict:
        t0 = time.time()
        end = t0 + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited while waiting for {what}:\n{self.tail()}")
            s = self.status()
            if cond(s):
                print(f"[liver] {time.time() - t0:.1f} s until {what} (step {s['step']})", flush=True)
                return s
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}: {self.status()}\n{self.tail()}\n{self.agents_tail()}")

    def tail(self) -> str:
        return "\n".join(line for line in (self.run_dir / "controller.log").read_text().splitlines()
                         if not line.startswith("step:"))[-4000:]

    def agents_tail(self, chars: int = 600) -> str:
        """Each agent's log and each worker's, their last lines but step lines (a wait that timed
        out says where every process stood: a run on a loaded machine is seldom repeated as it was)."""
        out = []
        for p in sorted([*self.run_dir.glob("agent-*.log"), *(self.run_dir / "logs").glob("proc*.log")]):
            text = "\n".join(x for x in p.read_text(errors="replace").splitlines() if "step:" not in x)
            out.append(f"--- {p.name}:\n{text[-chars:]}")
        return "\n".join(out)

    def close(self) -> None:
        for p in [self.proc, *self.agents.values()]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.log.close()
        # the job's store runs in a process of its own, made to outlive its controller (for a
        # resume): here the job is over
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(json.loads((self.run_dir / "store.json").read_text())["pid"], signal.SIGKILL)
        if self.net is not None:
            self.net.close()


def _ranks(s: dict) -> int:
    p = s["parallel"]
    return p["tp"] * p["pp"] * p["dp"] if p else 0


def _holders(s: dict) -> set[str]:
    return {n["node"] for n in s["nodes"] if n["ranks"]}


def _one(mode: str, args, out: Path) -> dict[str, Any]:
    timeout = args.timeout_s
    run_dir = out / f"run-{mode}"
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = ["--set", f"engine={absolute_engine_path(args.engine)}"] if args.engine else []
    sets += [x for t in getattr(args, "set", None) or () for x in ("--set", t)]
    job = LocalJob(run_dir, ["--model", args.model, "--backend", args.backend, "--gpus", "2", "--steps", "1000000",
                             "--end-after-events", "-1", "--digest", "switch", "--ckpt-every", "0", "--mode", mode,
                             *sets], args.backend)

    def agent(i: int) -> None:
        job.agent(f"node{i}", "--notice-file", str(run_dir / f"notice-node{i}"), index=i)

    try:
        agent(0)
        agent(1)
        s = job.wait(lambda s: s["step"] >= args.gap and _ranks(s) == 2, "the first generation on both nodes", timeout)
        (run_dir / "notice-node1").write_text(str(args.notice_s))  # node1's provider: notice_s to leave
        s = job.wait(lambda s: s["phase"] == "stable" and _ranks(s) == 1 and "node1" not in _holders(s),
                     "node1's rank gone after its notice", timeout)
        stop_agent(job.agents.pop("node1"), 0.0)  # its machine goes (its rank left already)
        job.wait(lambda s, at=s["step"]: s["step"] >= at + args.gap, "training on node0 alone", timeout)
        (run_dir / "notice-node1").unlink()
        agent(1)  # node1 is back: a new agent registers, and the job scales out onto it
        s = job.wait(lambda s: s["phase"] == "stable" and _ranks(s) == 2 and _holders(s) == {"node0", "node1"},
                     "the scale-out onto node1 again", timeout)
        job.wait(lambda s, at=s["step"]: s["step"] >= at + args.gap, "training on both", timeout)
        request(job.url, job.token, "POST", "/end", {"after": 2})
        if job.proc.wait(timeout) != 0:
            raise RuntimeError(f"the controller failed:\n{job.tail()}")
    finally:
        job.close()
    rep = json.loads((job.run_dir / "report.json").read_text())
    return {"mode": mode, "wall_s": rep.get("wall_s"), "steps": rep["steps"][-1]["step"] if rep["steps"] else 0,
            "events": [{"event": e["event"]["kind"], "node": e["event"].get("node"), **{k: e.get(k) for k in KEYS}}
                       for e in rep["events"]]}


def run(args) -> dict[str, Any]:
    """Both modes; writes OUT/nodes.json and returns it."""
    if args.model not in PRESETS:
        raise ValueError(f"--model={args.model!r}: allowed {', '.join(PRESETS)}")
    base, sets = job_layers(args)
    cfg = build(base, *sets)
    job = cfg.job  # (ValueError naming the field: engine=, job.model..., before anything runs)
    if args.gap < 1 or args.notice_s <= 0 or args.timeout_s <= 0:
        raise ValueError(f"--gap={args.gap}, --notice-s={args.notice_s}, --timeout-s={args.timeout_s}: allowed "
                         f"positive values")
    import torch
    if args.backend == "nccl" and torch.cuda.device_count() < 2:
        raise ValueError(f"--backend nccl: two nodes of one GPU each need 2 GPUs; this machine has "
                         f"{torch.cuda.device_count()} (--backend gloo: a CPU dry run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"torch": torch.__version__, "model": args.model, "engine": args.engine or "reference",
                              "backend": args.backend, "params": cfg.adapter.facts(job).params,
                              "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                              "runs": [_one(mode, args, out) for mode in ("live", "restart")]}
    live, restart = result["runs"]
    result["events"] = [{"event": a["event"], "node": a["node"], "old": a["old"], "new": a["new"],
                         "downtime_live_s": a["downtime_s"], "downtime_restart_s": b["downtime_s"],
                         "ratio": b["downtime_s"] / a["downtime_s"] if a["downtime_s"] and b["downtime_s"] else None,
                         "digest_equal_live": a["digest_equal"], "digest_equal_restart": b["digest_equal"],
                         "deadline_met_live": a["deadline_met"], "outcome_live": a["outcome"],
                         "status_live": a["status"], "outcome_restart": b["outcome"], "status_restart": b["status"]}
                        for a, b in zip(live["events"], restart["events"])]
    (out / "nodes.json").write_text(json.dumps(result, indent=1))
    return result
