"""Fencing: a node declared lost never trains again. Its processes stop when they read the fence;
their peers cut their connections to them and heal at once, instead of waiting on them for the
group's timeout; a worker cut off from the job's store stops itself; nothing a fenced rank 0
writes after the fence counts as the job's. The pieces with real processes over gloo and a real
store, then a whole job whose node's agent is frozen past its timeout (``tests/test_nodes.py``'s
harness)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist

from liver.protocol.messages import Fence
from liver.runtime.fence import FENCED, ORPHANED
from liver.world.broken import broken_group


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _one_frozen(target) -> Iterator[Any]:
    """Two ranks running ``target(rank, port, queue)`` over a store of the test's; once both said
    ready, rank 1 is stopped (SIGSTOP: no FIN, no RST, ever). Yields rank 0's queue; both are
    killed after."""
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 3, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    # a queue each: a queue's writers share a lock, and a rank stopped while its feeder thread
    # held it (its "ready" sent, the lock not yet released) kept the other's words from coming
    qs = [ctx.Queue(), ctx.Queue()]
    ps = [ctx.Process(target=target, args=(r, port, qs[r]), daemon=True) for r in (0, 1)]
    for p in ps:
        p.start()
    try:
        ready = {}
        for q in qs:
            what, rank, pid = q.get(timeout=120)
            assert what == "ready"
            ready[rank] = pid
        os.kill(ready[1], signal.SIGSTOP)
        yield qs[0]
    finally:
        del server
        for p in ps:
            if p.pid:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _blocked_rank(rank: int, port: int, q) -> None:
    from liver.world.sever import sever

    store = dist.TCPStore("127.0.0.1", port, 3, False, timeout=timedelta(seconds=60))  # (the test's: as a job's)
    pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=120))
    t = torch.ones(4)
    pg.allreduce([t]).wait()
    q.put(("ready", rank, os.getpid()))
    if rank == 1:
        time.sleep(600)  # (stopped by the test: a peer that never answers again)
        return
    import threading

    threading.Timer(1.0, lambda: q.put(("cut", sever({port})))).start()
    t0 = time.time()
    try:
        pg.allreduce([t]).wait()
        q.put(("done", None, time.time() - t0))
    except RuntimeError as e:
        q.put(("raised", broken_group(e), time.time() - t0))


def test_cutting_connections_wakes_a_collective_blocked_on_a_frozen_peer():
    """Gloo's abort does not wake a blocked all-reduce (see ``world/sever.py``); shutting the
    connections down does, at once, with an error the loop takes for a broken group; the
    store's connection is kept."""
    with _one_frozen(_blocked_rank) as q:
        got = {m[0]: m[1:] for m in (q.get(timeout=60), q.get(timeout=60))}
        assert got["cut"][0] >= 1
        broken, took = got["raised"]
        assert broken and took < 10.0  # (the group's timeout is 120 s)


def _sliced_rank(rank: int, port: int, q) -> None:
    from liver.world.group import Group

    from liver.world.group import parked

    store = dist.TCPStore("127.0.0.1", port, 3, False, timeout=timedelta(seconds=60))
    g = Group.create(store, "g", [0, 1], rank, "gloo", torch.device("cpu"), timedelta(seconds=GLOO_TIMEOUT_S))
    t = torch.ones(4)
    g.allreduce(t)
    if rank == 1:
        time.sleep(1.6)  # late: rank 0 waits through a slice, and must not take that for a failure
        g.allreduce(t)
        time.sleep(1.6)  # late again, to a receive (a pipeline stage behind a slow one)
        g.send(torch.full((4,), 7.0), 0)
        q.put(("ready", rank, os.getpid()))
        time.sleep(600)  # (then stopped by the test)
        return
    g.allreduce(t)
    assert t.tolist() == [4.0] * 4
    got = torch.zeros(4)
    try:
        g.recv(got, 1)  # (a timed wait that expires on a gloo receive closes its pair: never sliced)
    except RuntimeError as e:
        q.put(("receive failed", str(e)[:200], None))
        return
    assert got.tolist() == [7.0] * 4
    q.put(("ready", rank, os.getpid()))
    import threading

    threading.Timer(1.2, g.comm.cut.set).start()  # the flag only: no socket is cut, gloo is never woken
    t0 = time.time()
    try:
        g.allreduce(t)
        q.put(("done", None, time.time() - t0))
        return
    except RuntimeError as e:
        q.put(("raised", broken_group(e), time.time() - t0))
    t1 = time.time()
    g.abort()  # (as the stall does: gloo still runs the all-reduce until its timeout)
    q.put(("aborted", time.time() - t1, parked()))
    time.sleep(max(0.0, t0 + GLOO_TIMEOUT_S + 1.0 - time.time()))  # the all-reduce has timed out in gloo
    t2 = time.time()
    q.put(("released", time.time() - t2, parked()))


def test_a_gloo_wait_ends_once_its_communicator_is_cut_even_where_gloo_is_not_woken():
    """A survivor's all-reduce stayed blocked after its connections were cut, in about 2 of 80
    runs of the fenced-node test (the heal never came). Its wait now looks every second whether
    its communicator was cut (``World.interrupt`` marks it before cutting): with the mark alone
    and no socket touched, the blocked all-reduce fails within a slice, as a broken group; a peer
    merely late by more than a slice is waited for as before. The group then let go of (the
    stall's abort) does not wait for gloo's all-reduce: it is parked until that ends (a group let
    go of waited for it, to the group's timeout, and the stalled survivor never reported for the
    heal), and let go of once it has. A receive is never sliced: a timed wait that expires on a
    gloo receive closes its pair, and a stage that waited more than a slice for a slow peer broke
    its generation (bench/results/cpu-fence-repeats/recv_slice.py)."""
    with _one_frozen(_sliced_rank) as q:
        what, broken, took = q.get(timeout=60)
        assert what == "raised" and broken and 1.1 < took < GLOO_TIMEOUT_S - 1.0, (what, broken, took)
        what, took, count = q.get(timeout=60)
        assert what == "aborted" and took < 1.0 and count == 1, (what, took, count)  # (was: the timeout)
        what, took, count = q.get(timeout=60)
        assert what == "released" and count == 0, (what, took, count)


GLOO_TIMEOUT_S = 4.5  # the sliced test's group timeout: its cut comes at about 2.2 s


GUARD = textwrap.dedent("""
    import sys, tempfile, time
    from pathlib import Path
    from liver.runtime.courier import Courier
    from liver.host.process import ProcessRef
    from liver.runtime.fence import Guard
    from liver.world.world import connect_store
    connect = lambda: connect_store(sys.argv[1], timeout_s=5)
    courier = Courier(connect, int(sys.argv[2]), Path(tempfile.mkdtemp()) / "steps.jsonl")
    Guard(connect(), int(sys.argv[2]), lambda f: print("peer", list(f.procs), flush=True), float(sys.argv[3]),
          lambda: courier.contact, lambda: print("silenced", flush=True),
          agent=ProcessRef.parse(sys.argv[4]) if len(sys.argv) > 4 else None)
    print("watching", flush=True)
    time.sleep(60)
""")


def _guard(addr: str, proc: int, orphan_s: float, node=None, agent: str | None = None) -> subprocess.Popen:
    """A worker's guard and courier (its heartbeat) in a process of their own (``node``: in that
    node's network namespace; ``agent``: the process it watches as its agent's)."""
    argv = [sys.executable, "-c", GUARD, addr, str(proc), str(orphan_s), *([agent] if agent else [])]
    p = subprocess.Popen(node.command(argv) if node else argv, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert p.stdout.readline().strip() == "watching"
    return p


def test_a_fenced_worker_stops_at_once_and_its_peers_hear_of_it():
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    me, peer = _guard(f"127.0.0.1:{port}", 7, 0), _guard(f"127.0.0.1:{port}", 8, 0)
    try:
        Fence(procs=(7,), node="node1", time=time.time()).publish(server)
        assert me.wait(10) == FENCED
        out = me.stdout.read()
        assert out.splitlines()[0] == "silenced"  # (nothing posted after it: then it says why and ends)
        assert "its node node1 was declared lost by the controller" in out
        assert peer.stdout.readline().strip() == "peer [7]" and peer.poll() is None
    finally:
        for p in (me, peer):
            p.kill()
            p.wait()


@pytest.mark.parametrize("how", ["store gone", "link cut"])
def test_a_worker_that_loses_the_store_longer_than_its_timeout_stops_itself(how):
    """Its heartbeat unanswered for longer than its timeout (2 s here): the store's process gone,
    or its node's link cut (no FIN, no RST: every store call blocks), it ends by itself."""
    from liver.host import netns

    net = None
    if how == "link cut":
        why = netns.unavailable()
        if why is not None:
            pytest.skip(f"no network namespaces here: {why}")
        net = netns.Network()
    try:
        host = net.addr if net else "127.0.0.1"
        port = _free_port()
        server = dist.TCPStore(host, port, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
        node = net.node("node1") if net else None
        p = _guard(f"{host}:{port}", 3, 2.0, node)
        try:
            time.sleep(1.5)
            assert p.poll() is None  # (its heartbeat answered: it trains on)
            t0 = time.time()
            if net:
                node.cut()
            else:
                del server
            assert p.wait(20) == ORPHANED
            assert 1.5 <= time.time() - t0 < 6.0
            assert "no answer from the job's store" in p.stdout.read()
        finally:
            p.kill()
            p.wait()
    finally:
        if net:
            net.close()


def test_a_worker_whose_agent_is_killed_stops_itself_though_the_store_answers():
    """Its agent killed (and its controller with it: no one fences it), while the job's store
    lives on in a process of its own and answers its heartbeat: it ends once the agent has been
    gone for its timeout (before this, such a worker trained on unobserved for as long as the
    store lived). A stopped agent is still its agent: it may be continued."""
    from liver.host.process import ProcessRef

    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ref = None
    while ref is None or not ref.alive():
        ref = ProcessRef(agent.pid, int(Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]))
    p = _guard(f"127.0.0.1:{port}", 4, 1.0, agent=str(ref))
    try:
        os.kill(agent.pid, signal.SIGSTOP)
        time.sleep(1.8)
        assert p.poll() is None  # (stopped, not gone)
        t0 = time.time()
        agent.kill()
        agent.wait()
        assert p.wait(20) == ORPHANED
        assert 0.9 <= time.time() - t0 < 5.0
        out = p.stdout.read()
        assert f"its agent (pid {agent.pid}) is gone" in out and "has been gone for" in out
        assert server.check(["x"]) is False  # (the store answered throughout)
    finally:
        for q in (p, agent):
            q.kill()
            q.wait()


@pytest.mark.timeout(300)
def test_a_frozen_agents_node_is_fenced_its_peers_heal_and_it_comes_back_as_a_new_node(tmp_path):
    """The agent of the node holding rank 0 is stopped (SIGSTOP) past its timeout; its worker runs
    on. Declared lost, the node is fenced: its worker ends at once (before this, it trained on
    with the survivors for as long as the heal waited), the survivor heals from its replica,
    and no step record of the fenced rank 0 after the fence is the job's. The agent, continued,
    registers as a new node (nothing crashes) and the job scales out onto it again, its digest
    kept."""
    from test_nodes import Job, holders, ranks

    job = Job(tmp_path / "run")
    try:
        for name in ("node0", "node1"):
            job.agent(name)
        s = job.wait(lambda s: s["step"] >= 3 and ranks(s) == 2, "the first generation")
        rank0 = next(n["node"] for n in s["nodes"] if any(r == 0 for r, _ in n["ranks"]))
        other = ({"node0", "node1"} - {rank0}).pop()
        os.kill(job.agents[rank0].pid, signal.SIGSTOP)  # the agent only: its worker trains on
        s = job.wait(lambda s: s["phase"] == "stable" and holders(s) == {other} and s["step"] > 0, "the heal", 120)
        os.kill(job.agents[rank0].pid, signal.SIGCONT)
        s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 2, "the scale-out onto the node back", 150)
        job.train_on_and_end(s["step"])
    finally:
        job.close()
    rep = json.loads((job.run_dir / "report.json").read_text())
    kinds = [(e["event"]["kind"], e["outcome"]) for e in rep["events"]]
    assert kinds == [("fail-stop", "healed"), ("scale-out", "done")], kinds
    heal, back = rep["events"]
    assert f"node {rank0} lost" in heal["event"]["source"]
    assert heal["digest_before"] == heal["digest_after"] is not None or heal["digest_before"] is None
    assert back["digest_before"] == back["digest_after"] is not None
    # its rank 0 was fenced: no step of the old generation beyond what the heal kept is the job's (a
    # step it ended just after the decision, which the survivor trained too, is)
    late = [s for s in rep["steps"] if s["generation"] == heal["old_generation"] and s["step"] > heal["restored_step"]]
    assert not late, late
    logs = "".join(p.read_text() for p in (job.run_dir / "logs").glob("proc*.log"))
    # (it reads its fence, or its generation breaks first, the survivor having cut it, and it finds
    # itself left out of the heal: both stop it without another step)
    assert ("was declared lost by the controller; it stops without another step" in logs
            or "(its node was declared lost); it stops without another step" in logs), logs[-2000:]
    steps = [s["step"] for s in rep["steps"]]
    assert steps == sorted(set(steps)) and steps[-1] >= heal["restored_step"] + 2  # (each step once)


@pytest.mark.timeout(200)
def test_workers_stop_themselves_once_their_agents_and_controller_are_killed(tmp_path):
    """The controller and both agents SIGKILLed, the workers and the job's store left running (its
    own process, made to outlive a controller for a resume): no one is left to fence the workers,
    and the store answers their heartbeats. Each ends by itself once its agent has been gone for
    the timeout (4 s; before this, one trained on for 16 minutes at 87% of a core, until killed)."""
    from test_nodes import Job, ranks

    job = Job(tmp_path / "run")
    try:
        for name in ("node0", "node1"):
            job.agent(name)
        job.wait(lambda s: s["step"] >= 3 and ranks(s) == 2, "the first generation")
        pids = [w["pid"] for name in ("node0", "node1")
                for w in json.loads((job.run_dir / f"procs-{name}.json").read_text()) if w["alive"]]
        store = json.loads((job.run_dir / "store.json").read_text())["pid"]
        assert len(pids) == 2
        t0 = time.time()
        for p in [job.proc, *job.agents.values()]:
            os.kill(p.pid, signal.SIGKILL)  # (the process only: its workers live on)
            p.wait()
        alive = lambda pid: Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        while any(alive(p) for p in pids) and time.time() - t0 < 60:
            time.sleep(0.2)
        took = time.time() - t0
        assert not any(alive(p) for p in pids), f"workers {pids} still train {took:.0f} s after their agents died"
        assert 3.0 < took < 20.0
        assert alive(store)  # (it answered them throughout)
    finally:
        job.close()
    logs = "".join(p.read_text() for p in (job.run_dir / "logs").glob("proc*.log"))
    assert logs.count("it stops rather than train where no one can stop it") == 2, logs[-2000:]
