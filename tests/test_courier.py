"""The worker's courier (liver/runtime/courier.py): step records out and the controller's wish in,
off the training thread, over a real TCPStore."""

import json
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from liver.protocol import store as protocol
from liver.protocol.messages import Progress, Wish, beat_key
from liver.runtime.courier import Courier, Post, step_line


@pytest.fixture
def server():
    s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield s


SECRET = bytes(range(32))


def _connect(server):
    port = server.port
    return lambda: protocol.run_store(dist.TCPStore("127.0.0.1", port, 1, False, timeout=timedelta(seconds=10)), SECRET)


def _record(step: int) -> Progress:
    return Progress(step=step, generation=1, loss=2.5, step_s=0.01, time=1000.0 + step, parallel="tp1pp1dp1")


def test_a_wish_published_before_or_after_the_courier_starts_reaches_the_training_thread(server, tmp_path):
    ctl = protocol.run_store(server, SECRET)
    Wish(wanted=2).publish(ctl)
    c = Courier(_connect(server), 0, tmp_path / "steps.jsonl")
    assert c.wish() == Wish(wanted=2)  # the one before it started
    for n, w in enumerate([Wish(wanted=3, force=3), Wish(stop_at=17), Wish(end_at=40)], start=2):
        t0 = time.time()
        assert w.publish(ctl) == n
        while c.wish() != w:  # it wakes on the next version's key: no polling period to wait out
            assert time.time() - t0 < 2.0, f"wish {w} not seen"
            time.sleep(0.001)
    assert json.loads(ctl.get(Wish.KEY)) == {"wanted": 0, "stop_at": 0, "force": 0, "end_at": 40}


def test_records_go_out_in_order_and_drain_waits_for_them(server, tmp_path):
    ctl = protocol.run_store(server, SECRET)
    c = Courier(_connect(server), 7, tmp_path / "steps.jsonl")
    ends = []
    for k in range(1, 51):
        ends.append((k, 1000.0 + k))
        c.post(Post(_record(k), to_store=True, ends=tuple(ends[-3:]), log_as=""))
    c.post(Post(_record(51)))  # (not rank 0, not logged: nothing goes out)
    c.drain()
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 51)) and all(x["ends"] is None for x in lines)
    last = json.loads(ctl.get(Progress.KEY))
    assert last["step"] == 50 and last["ends"] == {"48": 1048.0, "49": 1049.0, "50": 1050.0}
    assert float(ctl.get(beat_key(7))) > time.time() - 5  # the heartbeat, on the same thread


def test_a_broken_store_surfaces_at_the_next_wish_read(tmp_path):
    s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    c = Courier(_connect(s), 0, tmp_path / "steps.jsonl")
    assert c.wish() == Wish()
    del s  # the controller's store is gone
    t0 = time.time()
    while True:
        try:
            c.wish()
        except RuntimeError:
            break
        assert time.time() - t0 < 5.0, "the reader did not notice its store was gone"
        time.sleep(0.01)


def test_the_step_line_flags_a_non_finite_loss():
    assert "NON-FINITE LOSS" in step_line(Progress(step=3, generation=1, loss=float("nan"), step_s=0.1, time=0.0,
                                                   parallel="tp1pp1dp1", grad_norm=1.0))


def test_drain_does_not_wait_on_a_posting_thread_whose_store_is_gone(tmp_path):
    s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    c = Courier(_connect(s), 0, tmp_path / "steps.jsonl")
    del s  # the controller's store is gone: the next write fails and the posting thread ends
    c.post(Post(_record(1), to_store=True))
    time.sleep(0.6)  # (its heartbeat, due every 0.5 s, has failed by now)
    t0 = time.time()
    c.drain(timeout_s=10.0)
    assert time.time() - t0 < 2.0


def test_a_step_whose_cut_breaks_is_still_posted():
    """A peer lost in the boundary's collective: the cut raises, and the step it closed (done, its
    state kept, the survivors heal from it) still has its record handed to the courier (once a
    regression lost that line: CI's run of a leaving replica killed in Prepare)."""
    import types

    import torch

    from liver.runtime.member import Member

    class Broken:  # the Active World's group, a peer gone mid-collective
        local, device = False, torch.device("cpu")

        def allreduce(self, v, op):
            raise RuntimeError("Connection closed by peer")

    posted = []
    m = Member.__new__(Member)
    m.engine = types.SimpleNamespace(world=types.SimpleNamespace(all=Broken(), rank=0), step=7)
    m.companion = None
    m.courier = types.SimpleNamespace(wish=lambda: None, post=posted.append)
    m.ckpt = types.SimpleNamespace(busy=lambda: False)
    post = Post(_record(7), to_store=True)
    with pytest.raises(RuntimeError, match="closed by peer"):
        m.boundary(0.01, post)
    assert posted == [post]
