"""The pure parts of a job on several nodes, in-process: TP groups placed within nodes, the policy
for a node that joins, the controller's side of an agent (commands, acknowledgements, exits), the
job's slot ids, the agent protocol's messages and the endpoint's agent routes."""

import http.client
import json
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liver.agent.node import Worker
from liver.config.fields import from_dict, to_dict
from liver.policy.decisions import join_total
from liver.controller.nodes import Nodes, RemoteNode
from liver.controller.state import ControllerState
from liver.planner.nodes import tp_groups_split, tp_within_nodes
from liver.protocol.agent import KILLED, NODE_LOST, Exited, Notice, Running, Sync, SyncReply, Wait
from liver.topology import ParallelConfig
from liver.topology.config import ModelConfig, TrainConfig
from liver.topology.layout import Layout


@st.composite
def placements(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.integers(1, 3))
    pp = draw(st.integers(1, 2))
    n = tp * dp * pp
    procs = draw(st.permutations(list(range(100, 100 + n))))
    nodes = draw(st.lists(st.sampled_from("abcd"), min_size=n, max_size=n))
    return tp, dp, pp, list(procs), dict(zip(procs, nodes))


def layout_of(tp: int, dp: int, pp: int) -> Layout:
    model = ModelConfig(num_layers=4, hidden_size=16, num_heads=4, ffn_size=32, vocab_size=64, vocab_multiple=16,
                        seq_len=8)
    return Layout(model.num_layers, ParallelConfig(tp=tp, pp=pp, dp=dp), TrainConfig(global_batch=dp * 2, micro_batch=1),
                  tp * pp * dp)


@settings(max_examples=400, deadline=None)
@given(placements())
def test_tp_groups_land_within_nodes_wherever_the_counts_allow(case):
    tp, dp, pp, placement, node_of = case
    lay = layout_of(tp, dp, pp)
    out = tp_within_nodes(lay, placement, node_of)
    assert sorted(out) == sorted(placement)  # the same processes, one rank each
    if tp_groups_split(lay, placement, node_of) == 0:
        assert out == placement  # nothing to mend: unchanged
    if all(c % tp == 0 for c in Counter(node_of.values()).values()):
        assert tp_groups_split(lay, out, node_of) == 0
    for g in lay.all_groups("tp"):  # a group that was whole on one node keeps its processes
        if len({node_of[placement[r]] for r in g}) == 1:
            assert [out[r] for r in g] == [placement[r] for r in g]
    assert tp_groups_split(lay, out, node_of) <= tp_groups_split(lay, placement, node_of)


def test_a_split_group_is_mended_with_the_fewest_moves():
    lay = layout_of(2, 2, 1)  # TP groups (0, 1) and (2, 3)
    placement = [10, 11, 12, 13]
    node_of = {10: "a", 11: "b", 12: "a", 13: "b"}  # both groups split
    out = tp_within_nodes(lay, placement, node_of)
    assert tp_groups_split(lay, out, node_of) == 0
    assert sum(a == b for a, b in zip(out, placement)) == 2  # each group kept one of its processes


def steps(table):
    return lambda n: table.get(n)


@pytest.mark.parametrize("policy,table,n_now,cap,want", [
    ("now", {2: 1.0, 3: 0.9, 4: 0.8}, 2, 4, 4),
    ("now", {2: 1.0, 3: 0.9}, 2, 4, 3),          # 4 is not a valid count: the largest that is
    ("now", {2: 1.0}, 2, 4, None),                # no larger valid count
    ("better", {2: 1.0, 4: 1.2}, 2, 4, None),     # slower: stay
    ("better", {2: 1.0, 4: 0.7}, 2, 4, 4),
    ("never", {2: 1.0, 4: 0.1}, 2, 4, None),
    ("now", {2: 1.0, 4: 0.5}, 4, 4, None),        # no more slots than ranks
])
def test_join_policy(policy, table, n_now, cap, want):
    assert join_total(policy, n_now, cap, steps(table)) == want


def test_join_policy_refuses_an_unknown_one():
    with pytest.raises(ValueError, match="controller.on_join='often'"):
        join_total("often", 2, 4, steps({}))


def test_a_remote_node_resends_until_acknowledged_and_reports_each_exit_once():
    n = RemoteNode("n0", 4, 2)
    assert n.free_slots() == [4, 5]
    n.start(7, 4, "joiner", 3)
    n.start(8, 5, "start", 3)
    assert n.free_slots() == []
    first = n.sync(Sync(node="n0"))
    assert [(c.op, c.proc) for c in first.commands] == [("start", 7), ("start", 8)]
    again = n.sync(Sync(node="n0", done=1, started=(Running(proc=7, slot=4, role="joiner", generation=3, pid=99),)))
    assert [c.id for c in again.commands] == [2]  # the first one was carried out
    assert n.workers[7].pid == 99
    n.sync(Sync(node="n0", done=2, exited=(Exited(proc=8, returncode=1, tail="boom"),)))
    n.sync(Sync(node="n0", done=2, exited=(Exited(proc=8, returncode=1, tail="boom"),)))  # (a resent report)
    out = n.poll()
    assert [(w.proc, w.returncode) for w in out] == [(8, 1)] and n.poll() == []
    assert n.log_tail(8) == "boom" and n.free_slots() == [5]
    n.kill(7)  # killed for the job at once; the agent does it at its next sync
    assert n.workers[7].returncode == KILLED and n.free_slots() == [4, 5]
    assert [(c.op, c.proc) for c in n.sync(Sync(node="n0", done=2)).commands] == [("kill", 7)]
    n.sync(Sync(node="n0", done=3, exited=(Exited(proc=7, returncode=-9),)))
    assert n.poll() == []  # its exit was the controller's own doing: not reported again


def test_a_lost_node_gives_up_its_processes_and_its_slots():
    nodes = Nodes()
    a = nodes.add(lambda base: RemoteNode("a", base, 2))
    b = nodes.add(lambda base: RemoteNode("b", base, 3))
    assert (a.slot_base, b.slot_base) == (0, 2) and nodes.slots() == [0, 1, 2, 3, 4]
    nodes.start(0, 3, "start", 0)
    assert nodes.where(0) == "b" and nodes.free_slots() == [0, 1, 2, 4]
    gone = b.mark_lost()
    assert [(w.proc, w.returncode) for w in gone] == [(0, NODE_LOST)]
    assert nodes.slots() == [0, 1] and nodes.free_slots() == [0, 1]
    a.notice = Notice(source="SIGTERM", deadline_s=30)
    assert nodes.slots() == []  # a node with a notice takes no new process
    with pytest.raises(ValueError, match="node 'a' is already in the job"):
        nodes.add(lambda base: RemoteNode("a", base, 1))
    with pytest.raises(KeyError, match="slot 9"):
        nodes.node_of(9)
    assert isinstance(nodes.workers[0], Worker)


def test_agent_messages_check_their_fields():
    msg = Sync(node="n", done=3, exited=(Exited(proc=1, returncode=0),), notice=Notice(source="x", deadline_s=2.0))
    assert from_dict(Sync, json.loads(json.dumps(to_dict(msg))), "sync") == msg
    with pytest.raises(ValueError, match="sync.done='3': expected an integer"):
        from_dict(Sync, {"node": "n", "done": "3"}, "sync")
    with pytest.raises(ValueError, match="sync.extra: no such field"):
        from_dict(Sync, {"node": "n", "extra": 1}, "sync")
    with pytest.raises(ValueError, match="command.op='reboot'"):
        from_dict(SyncReply, {"commands": [{"id": 1, "op": "reboot"}]}, "reply")


def test_the_endpoint_serves_agents_over_one_kept_connection(tmp_path):
    from liver.controller.endpoint import ControlEndpoint

    seen = []

    def agents(what, body):
        seen.append(what)
        if body.get("bad"):
            raise ValueError("sync.bad: no such field")
        return {"ok": what}

    ep = ControlEndpoint(lambda a: {}, lambda: {}, tmp_path, token="t", agents=agents)
    try:
        port = int(ep.url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        auth = {"Authorization": "Bearer t", "Content-Type": "application/json"}
        for i in range(5):
            conn.request("POST", "/agent/sync", json.dumps({"n": i}), auth)
            r = conn.getresponse()
            assert (r.status, json.loads(r.read())) == (200, {"ok": "sync"})
        conn.request("POST", "/agent/sync", json.dumps({"bad": 1}), auth)
        r = conn.getresponse()
        assert r.status == 400 and "sync.bad" in json.loads(r.read())["error"]
        conn.request("POST", "/agent/sync", "[1, 2", auth)
        r = conn.getresponse()
        assert r.status == 400
        r.read()
        conn.request("POST", "/agent/register", "{}", {"Authorization": "Bearer nope"})
        r = conn.getresponse()
        assert r.status == 401
        r.read()
        conn.close()
        assert seen == ["sync"] * 6
    finally:
        ep.close()


def test_a_node_restored_from_the_journal_is_reconciled_with_what_its_agent_runs():
    """The journal had procs 1 and 2 started (commands 1, 2, carried out) and the start of 3
    (command 3) not yet. The agent, back, runs 2 only and did command 2 last: 1 ended while no
    controller listened (its exit is reported, code unknown), 3 is still to come, and what the new
    controller sent before the agent came back (kill 2) follows it."""
    n = RemoteNode("a", 0, 4)
    n.start(1, 0, "start", 0)
    n.start(2, 1, "start", 0)
    n.sync(Sync(node="a", done=2))
    n.start(3, 2, "joiner", 1)
    back = RemoteNode.restored(n.record())
    assert back.resumed
    back.kill(2)
    back.reconcile([Running(proc=2, slot=1, role="start", generation=0, pid=5)], done=2)
    assert [(w.proc, w.returncode) for w in back.poll()] == [(1, -1)]
    assert back.workers[3].returncode is None and not back.resumed
    assert [(c.id, c.op, c.proc) for c in back.commands] == [(3, "start", 3), (4, "kill", 2)]


def test_commands_the_journal_never_saw_do_not_swallow_new_ones():
    """The old controller sent commands 4 and 5 after its last journal write (the agent did them);
    the new one's first command must come after 5, not be taken for one already done."""
    n = RemoteNode("a", 0, 4)
    for p in (1, 2, 3):
        n.start(p, p - 1, "start", 0)
    n.sync(Sync(node="a", done=3))
    back = RemoteNode.restored(n.record())
    back.kill(3)  # id 4 in the new controller's numbering
    back.reconcile([Running(proc=p, slot=p - 1, role="start", generation=0, pid=p) for p in (2, 3)], done=5)
    assert [w.proc for w in back.poll()] == [1]
    assert [(c.id, c.op, c.proc) for c in back.commands] == [(6, "kill", 3)]
    assert back.sync(Sync(node="a", done=5)).commands[0].id == 6


def test_an_agent_with_a_wrong_token_or_a_taken_name_is_refused_in_words(tmp_path):
    from liver.agent.service import AgentService
    from liver.controller.endpoint import ControlEndpoint

    def agents(what, body):
        raise ValueError(f"node {body['node']!r}: a node of that name is in the job with 2 slots; allowed: a name "
                         "of its own")

    ep = ControlEndpoint(lambda a: {}, lambda: {}, tmp_path, token="right", agents=agents)
    try:
        with pytest.raises(ValueError, match="refused the token"):
            AgentService(ep.url, "wrong", 1, node="n").register()
        with pytest.raises(ValueError, match="a node of that name is in the job"):
            AgentService(ep.url, "right", 1, node="n").register()
    finally:
        ep.close()


def test_several_agents_on_one_machine_get_their_own_gpus_numbered_from_zero():
    import pytest

    from liver.agent.local import node_devices
    assert [node_devices(i, 1) for i in range(2)] == ["0", "1"]
    assert [node_devices(i, 2) for i in range(2)] == ["0,1", "2,3"]
    assert node_devices(1, 2, "4, 5,6,7") == "6,7"
    assert node_devices(0, 1, "") == ""  # hidden GPUs stay hidden
    with pytest.raises(ValueError, match=r"node1: its GPUs 2-3 are beyond CUDA_VISIBLE_DEVICES='0,1'"):
        node_devices(1, 2, "0,1")


def test_a_registration_under_a_known_name_is_the_same_agent_only_from_the_same_process():
    from liver.controller.nodes import RemoteNode
    n = RemoteNode("node1", 0, 1, "vm", agent_pid=41)
    assert n.same_agent("vm", 41)  # it lost its controller, or a reply: reconciled
    assert not n.same_agent("vm", 42) and not n.same_agent("other", 41)  # the node came back: a new node
    assert RemoteNode("node1", 0, 1, "vm").same_agent("vm", 42)  # (unknown pid, from an older journal)
    assert RemoteNode.restored({**n.record(), "agent_pid": 41}).agent_pid == 41
    assert n.running() == []


def test_a_lost_node_that_registers_again_during_its_fail_stop_leaves_its_processes_found():
    """The controller's own registration (``Membership.register``) of a node declared lost,
    under its name, while the fail-stop of its ranks is handled: the newcomer is a new node with
    slots of its own; the old one's processes are still found, named and killed (before, the old
    node left the job's table and the fail-stop died on a KeyError, and the job with it)."""
    from types import SimpleNamespace

    from liver.controller.membership import Membership
    from liver.protocol.agent import Register

    nodes = Nodes()
    a = nodes.add(lambda base: RemoteNode("a", base, 2, "vm-a", agent_pid=10))
    nodes.add(lambda base: RemoteNode("b", base, 2, "vm-b", agent_pid=20))
    for proc, slot in ((0, 0), (1, 1), (2, 2), (3, 3)):
        nodes.start(proc, slot, "start", 0)
    lost = a.mark_lost()  # (the controller's loop, at agent_timeout_s)
    ctl = SimpleNamespace(nodes=nodes, cfg=SimpleNamespace(controller=SimpleNamespace(agent_timeout_s=5.0)),
                          state=ControllerState(), base_spec={}, starter_spec=lambda: {},
                          phase_log=lambda *a, **kw: None)
    reply = Membership(ctl, url=lambda: "?").register(Register(node="a", slots=2, host="vm-a", pid=11))  # the endpoint's thread
    new = nodes.nodes["a"]
    assert new is not a and reply.slot_base == new.slot_base == 4 and ctl.state.joined == ["a"]
    # the fail-stop over the old node's processes, after the newcomer registered
    assert [nodes.where(w.proc) for w in lost] == ["a", "a"] and nodes.node_of(1) is a
    nodes.kill(0)
    assert nodes.log_tail(0) == "" and nodes.free_slots() == [4, 5]  # the old slots are not offered again


def test_a_resumed_controller_withdraws_what_the_dead_one_announced_after_its_journal():
    """The controller died between announcing a generation (its spec, the ranks' wish) and its
    journal's next write: the one resumed from that journal withdraws it, never uses its number
    again, tells the ranks nothing is wanted, and stops the processes started for it; one that the
    ranks committed (not seen: a switch takes Prepare's seconds) is a loud error, not a guess."""
    from pathlib import Path
    from types import SimpleNamespace

    import torch.distributed as dist

    from liver.controller.failures import ControllerError
    from liver.controller.live import LiveMode
    from liver.controller.membership import WITHDRAWN_GRACE_S, Membership
    from liver.controller.phases import Phase
    from liver.protocol.agent import Register
    from liver.protocol.store import COMMIT, WITHDRAW, decide, decided

    from liver.protocol.messages import GenerationSpec
    from liver.topology import ParallelConfig

    store, said = dist.HashStore(), []
    GenerationSpec(generation=1, parallel=ParallelConfig(dp=3), procs=(0, 1, 2)).publish(store)
    store.set("gen/2", "{}")  # (one that cannot be read is withdrawn all the same)
    ctl = SimpleNamespace(store=store, state=ControllerState(gen=0, phase=Phase.STABLE), run_dir=Path("/nonexistent"),
                          wish=lambda: said.append("nothing wanted"), phase_log=lambda what, **kw: said.append(what),
                          nodes=Nodes())
    ctl.nodes.new_proc_ids(2)  # (the journal's: processes 0 and 1)
    LiveMode(ctl)._forget_unjournaled()
    assert ctl.state.gen == 2 and decided(store, 1) == decided(store, 2) == WITHDRAW
    assert said == ["nothing wanted", "cancelled", "cancelled"]
    assert ctl.nodes.new_proc_ids(1) == [3]  # (generation 1's joiner, process 2, may run: its id is not reused)
    store.set("gen/3", "{}")
    assert decide(store, 3, COMMIT) == COMMIT
    with pytest.raises(ControllerError, match="generation 3 was committed"):
        LiveMode(ctl)._forget_unjournaled()

    nodes = Nodes()
    n = nodes.add(lambda base: RemoteNode("n", base, 2, "vm", agent_pid=5))
    nodes.start(0, 0, "start", 0)
    n.resumed = True  # (restored from the journal: proc 0 only)
    reg = SimpleNamespace(nodes=nodes, cfg=None, state=ControllerState(), base_spec={}, starter_spec=lambda: {},
                          phase_log=lambda *a, **kw: None)
    Membership(reg, url=lambda: "?").register(Register(node="n", slots=2, host="vm", pid=5, done=1, workers=(
        Running(proc=0, slot=0, role="start", generation=0, pid=100),
        Running(proc=7, slot=1, role="joiner", generation=1, pid=101),  # (started after the journal)
        Running(proc=6, slot=1, role="joiner", generation=1, pid=99))))  # (one that ends by itself)
    n.sync(Sync(node="n", done=1, exited=(Exited(proc=6, returncode=0),)))
    # not stopped at once: the members of its group rendezvous would wait for it there until their
    # timeout; it ends by itself, or is stopped after the grace, and its slot is not offered before
    assert n.workers[7].returncode is None and n.settling() and nodes.free_slots() == []
    n.reap(time.time())
    assert n.workers[7].returncode is None and n.settling() and 6 not in n.withdrawn
    n.reap(time.time() + WITHDRAWN_GRACE_S + 1)
    assert n.workers[7].returncode == KILLED and not n.settling() and n.workers[0].returncode is None
    assert nodes.new_proc_ids(1) == [8]  # its number is not used again


def test_a_node_new_to_a_resumed_controller_gets_commands_numbered_after_what_its_agent_did():
    """The controller died after its agent on node n carried out 'start process 2' (command 1)
    and before its journal knew the node; the resumed one takes n for a new node with the same
    slots (its agent keeps counting). Its commands (stop process 2, start process 3) are numbered
    after the agent's last, so that none is taken for one already carried out (a fresh clone's
    run: the new joiner was never started, and the scale-out waited out its groups' timeout).
    Process 2, of the withdrawn generation, is let end by itself (stopped at once, it held the
    ranks in its group rendezvous until their timeout: another fresh clone's run); the node
    settles, and no event begins, until it has, or until its grace runs out (then stopped)."""
    from types import SimpleNamespace

    from liver.controller.membership import WITHDRAWN_GRACE_S, Membership
    from liver.protocol.agent import Register

    nodes = Nodes()
    reg = SimpleNamespace(nodes=nodes, cfg=None, state=ControllerState(), base_spec={}, starter_spec=lambda: {},
                          phase_log=lambda *a, **kw: None)
    Membership(reg, url=lambda: "?").register(Register(node="n", slots=1, host="vm", pid=5, done=1, workers=(
        Running(proc=2, slot=0, role="joiner", generation=1, pid=100),)))
    n = nodes.nodes["n"]
    assert n.settling() and n.workers[2].returncode is None and not n.commands
    n.sync(Sync(node="n", done=1, exited=(Exited(proc=2, returncode=0),)))
    n.reap(time.time())
    assert not n.settling()
    nodes.start(nodes.new_proc_ids(1)[0], 0, "joiner", 2)
    sent = n.sync(Sync(node="n", done=1)).commands
    assert [(c.op, c.proc) for c in sent] == [("start", 3)] and min(c.id for c in sent) > 1
    # one that does not end by itself is stopped when its grace runs out
    back = Nodes()
    reg.nodes = back
    Membership(reg, url=lambda: "?").register(Register(node="m", slots=1, host="vm", pid=6, workers=(
        Running(proc=4, slot=0, role="joiner", generation=1, pid=101),)))
    m = back.nodes["m"]
    m.reap(time.time() + WITHDRAWN_GRACE_S + 1)
    assert [(c.op, c.proc) for c in m.sync(Sync(node="m")).commands] == [("kill", 4)] and not m.settling()


def test_a_standing_wait_is_answered_as_soon_as_a_command_is_queued_or_the_node_is_poked_or_lost():
    import threading

    n = RemoteNode("n0", 0, 2)
    heard = n.last_heard
    assert n.await_command(0, 0.05) is False  # nothing for it: held, then answered "not ready"
    assert n.last_heard > heard and n.last_seen == heard  # (a heartbeat, not a sync)
    got = []

    def wait(after):
        t = threading.Thread(target=lambda: got.append(n.await_command(after, 30.0)))
        t.start()
        time.sleep(0.05)
        return t

    waiter = wait(0)
    n.start(3, 0, "joiner", 1)
    waiter.join(5)
    assert got == [True]
    assert n.await_command(1, 0.01) is False  # (after the one it took: none)
    n.sync(Sync(node="n0"))
    assert len(n.delivery_s) == 1 and 0 <= n.delivery_s[0] < 5
    n.sync(Sync(node="n0"))  # (sent again: its delivery is counted once)
    assert len(n.delivery_s) == 1
    waiter = wait(1)
    n.poke()  # the controller wants it to sync (a recovery): answered, until it syncs
    waiter.join(5)
    assert got == [True, True] and n.await_command(1, 0.0) is True
    n.sync(Sync(node="n0"))
    assert n.await_command(1, 0.01) is False
    waiter = wait(1)
    n.mark_lost()
    waiter.join(5)
    assert got == [True, True, True]
    with pytest.raises(ValueError, match="wait.wait_s=61.0: allowed 0 to 60 s"):
        from_dict(Wait, {"node": "n0", "wait_s": 61.0}, "wait")


def test_a_command_reaches_an_agent_before_its_next_sync_through_its_standing_wait(tmp_path):
    """Fifty-two nodes at 10 syncs a second: each node's interval is 5.2 s, and its agent's
    standing wait is held that long; a command queued meanwhile reaches the agent's link thread
    through the wait thread, in a round trip. The waits are the node's heartbeat."""
    import threading

    from fake_job import controller
    from liver.agent.service import AgentService
    from liver.controller.endpoint import ControlEndpoint

    ctl, _, _ = controller(tmp_path, syncs_per_s=10)
    for i in range(50):
        ctl.membership.agent_request("register", {"node": f"sim{i}", "slots": 1})
    ep = ControlEndpoint(lambda a: {}, lambda: {}, tmp_path, token="t", agents=ctl.membership.agent_request)
    svc = AgentService(ep.url, "t", 1, node="real")
    try:
        svc.register()
        for target in (svc._link, svc._wait):
            threading.Thread(target=target, daemon=True).start()
        end = time.time() + 10
        while not svc._waits and time.time() < end:
            time.sleep(0.01)
        reply = ctl.membership.agent_request("sync", {"node": "sim0"})
        assert reply["next_sync_s"] == 5.2 and reply["waits"] is True
        time.sleep(0.3)  # (the link thread waits out its interval now, the wait is held)
        real = ctl.nodes.nodes["real"]
        synced = real.last_seen
        real.shutdown()
        epoch, command = svc._inbox.get(timeout=2.5)
        assert command.op == "shutdown" and real.delivery_s[-1] < 2.5
        assert real.last_heard >= synced  # (its heartbeat)
    finally:
        svc._stop.set()
        svc._news.set()
        ep.close()


@settings(max_examples=200, deadline=None)
@given(names=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=20, unique=True),
       interval=st.floats(0.1, 20.0), now=st.floats(1e9, 2e9))
def test_a_standing_wait_is_held_to_its_nodes_own_point_of_the_interval(names, interval, now):
    """Each node's waits end at its own point of every interval (not all together), held between
    a tenth of an interval and 1.1 intervals: a node is heard from at least that often."""
    from liver.controller.membership import Membership

    for name in names:
        n = RemoteNode(name, 0, 1)
        hold = Membership.hold(n, interval, now)
        assert 0.1 * interval - 1e-9 <= hold <= 1.1 * interval + 1e-9
        frac = ((now + hold) / interval + n.phase) % 1.0  # (at its own point: a whole number of intervals)
        assert min(frac, 1.0 - frac) < 1e-4
