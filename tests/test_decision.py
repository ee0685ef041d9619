"""The commit/withdraw decision on a pending generation is one compare-and-set on a real
TCPStore: whoever writes first holds, both sides read the same answer, nobody waits."""

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from liver.protocol.store import COMMIT, WITHDRAW, decide, decided, run_store

SECRET = bytes(range(32))


@pytest.fixture
def store():
    master = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    yield run_store(master, SECRET)


def test_first_decision_holds(store):
    assert decided(store, 1) is None
    assert decide(store, 1, WITHDRAW) == WITHDRAW
    assert decide(store, 1, COMMIT) == WITHDRAW  # rank 0 learns it was withdrawn: it does not switch
    assert decide(store, 2, COMMIT) == COMMIT
    assert decide(store, 2, WITHDRAW) == COMMIT  # the controller learns the switch goes on
    assert decided(store, 1) == WITHDRAW and decided(store, 2) == COMMIT
    with pytest.raises(ValueError, match="decision='maybe'"):
        decide(store, 3, "maybe")


def test_racing_commit_and_withdraw_agree_every_time(store):
    """Rank 0 and the controller race on 300 generations, each over its own connection: both
    read the same answer, one of the two proposals."""
    port = store.underlying_store.port
    clients = {who: run_store(dist.TCPStore("127.0.0.1", port, 1, False, timeout=timedelta(seconds=10)), SECRET)
               for who in ("rank0", "controller")}
    proposal = {"rank0": COMMIT, "controller": WITHDRAW}
    won = set()
    for g in range(1, 301):
        answers = {}
        barrier = threading.Barrier(2)

        def propose(who, g=g):
            barrier.wait()
            answers[who] = decide(clients[who], g, proposal[who])

        threads = [threading.Thread(target=propose, args=(who,)) for who in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert answers["rank0"] == answers["controller"] in (COMMIT, WITHDRAW)
        won.add(answers["rank0"])
    assert decided(store, 300) in won
