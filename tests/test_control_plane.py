"""The job's control plane against a stranger who reaches its store (issue 33, item 4): the job's
keys live under a prefix made from its secret, and the one value it unpickles (the transfer plan)
is sealed with it (liver/protocol/secret.py). A forged plan is refused before anything is
unpickled; the job trains on."""

from __future__ import annotations

import pathlib
import pickle
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from liver.protocol import secret as job_secret
from liver.protocol.secret import Forged
from liver.protocol.store import fetch_plan, publish_plan, run_store

from test_run import check_continuous, liver


class _Payload:
    """What a stranger would have a worker unpickle: a file made on the worker's machine."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def test_a_plan_is_unpickled_only_when_sealed_with_the_jobs_secret_and_for_its_own_key(tmp_path):
    master = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    secret, other = bytes(range(32)), bytes(range(1, 33))
    store = run_store(master, secret)
    publish_plan(store, 3, {"plan": 3}, secret)
    assert fetch_plan(store, 3, secret) == {"plan": 3}
    marker = tmp_path / "ran"
    for forged in (pickle.dumps(_Payload(marker)),                                    # unsealed
                   job_secret.seal(other, "plan/4", pickle.dumps(_Payload(marker))),  # another job's secret
                   store.get("plan/3")):                                              # a real plan, moved
        store.set("plan/4", forged)
        with pytest.raises(Forged, match="plan/4"):
            fetch_plan(store, 4, secret)
    assert not marker.exists()
    # another secret names other keys: a job's keys are out of reach of whoever lacks its secret
    assert run_store(master, other).check(["plan/3"]) is False
    assert not dist.PrefixStore("run/", master).check(["plan/3"])


@pytest.mark.timeout(600)
def with_a_stranger(run_dir: Path, write) -> dict:
    """The job of the forgery tests (a reshape at step 6 of a TP2 job), while a stranger who
    reaches its store and knows where the job's keys are (not its secret: the test's knowledge)
    calls ``write(keys, done)`` from another thread; the job's report."""
    import json

    events = run_dir.parent / "events.txt"
    events.write_text("at step 6: reshape 1,1,2\n")
    done = threading.Event()

    def stranger() -> None:
        while not (run_dir / "control.json").exists() or not list((run_dir / "specs").glob("proc*.json")):
            if done.wait(0.01):
                return
        token = json.loads((run_dir / "control.json").read_text())["token"]
        addr = json.loads(next((run_dir / "specs").glob("proc*.json")).read_text())["store_addr"]
        host, port = addr.rsplit(":", 1)
        where = f"run/{job_secret.tag(job_secret.of_token(token), 'store')}/"
        write(dist.PrefixStore(where, dist.TCPStore(host, int(port), 1, False, timeout=timedelta(seconds=30))), done)

    t = threading.Thread(target=stranger, daemon=True)
    t.start()
    try:
        rep = liver(run_dir, "--events", str(events), "--parallel", "2,1,1", "--steps", "100000",
                    "--end-after-events", "6", "--ckpt-every", "0")
    finally:
        done.set()
        t.join(timeout=10)
    assert rep["rc"] == 0
    check_continuous(rep, rep["steps"][-1]["step"])
    assert {s["parallel"] for s in rep["steps"]} == {"tp2pp1dp1"}  # it trained on, as it was
    return rep


def test_a_forged_plan_in_the_jobs_store_is_refused_logged_and_the_job_trains_on(tmp_path):
    """A stranger writes a plan of their own over the controller's, again and again, from before
    the event: every worker that reads it refuses it unread, the handoff is cancelled with the
    reason, and the job trains on; nothing of theirs ran."""
    marker = tmp_path / "ran"
    forged = pickle.dumps(_Payload(marker))

    def write(keys, done) -> None:
        while not done.is_set():
            keys.set("plan/1", forged)
            time.sleep(0.0005)

    (ev,) = with_a_stranger(tmp_path / "run", write)["events"]
    assert ev["status"].startswith("cancelled") and "not sealed with the job's secret" in ev["status"], ev["status"]
    assert not marker.exists()


def _listening(port: int) -> set[str]:
    """The local addresses something listens on at ``port`` (hex, as /proc/net/tcp and tcp6 say)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:  # (0A: LISTEN)
                out.add(addr)
    return out


def test_the_jobs_store_listens_on_the_interface_it_is_given_only():
    from liver.world.world import connect_store, make_store
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp on this machine to see what listens")
    store, addr = make_store(host="127.0.0.1")
    assert _listening(store.port) == {"0100007F"}  # 127.0.0.1, not every interface (torch's own server would)
    client = connect_store(addr)
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_a_forged_decision_in_the_jobs_store_is_refused_logged_and_the_job_trains_on(tmp_path, capfd):
    """A stranger writes "commit" for the next generations ahead of the job, so that the ranks
    would switch into a generation nobody made ready: each decision is refused as the job's,
    said, and taken as a withdrawal (the handoff is cancelled at once), and the job trains on."""
    def write(keys, done) -> None:
        for g in range(1, 4):
            keys.set(f"decision/{g}", "commit")

    (ev,) = with_a_stranger(tmp_path / "run", write)["events"]
    assert ev["outcome"] == "cancelled" and "was not the job's" in ev["status"], ev["status"]
    said = capfd.readouterr().out + "".join(p.read_text() for p in (tmp_path / "run" / "logs").glob("proc*.log"))
    assert "'decision/1'" in said and "not sealed with the job's secret" in said
