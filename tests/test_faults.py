"""The fault matrix's cases that need a fault inside a process (``liver.host.faults``): a source
and a destination that die in the middle of a transfer, an event that arrives during a switch, a
disk that fills under the periodic checkpoints. Each ends with the digest checks and the count
of lost steps the design allows. (The other cases: a joiner killed in Prepare, a source killed at
the handoff, kill -9 in steady state, a missed deadline in tests/test_run.py; a hang and a corrupt
newest checkpoint in tests/test_heal.py; a stale target, by a joiner lost and by a notice, in
tests/test_run.py too.)"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from liver.controller.endpoint import request
from liver.host import faults
from test_run import background, check_continuous, liver, procs, wait_for


def test_fault_specs_are_checked():
    assert faults.parse("transfer:2:1, disk-full:0") == {("transfer", 2): "1", ("disk-full", 0): ""}
    for bad in ("transfer", "melt:1", "transfer:x"):
        with pytest.raises(ValueError, match="allowed POINT:PROC"):
            faults.parse(bad)


def _control(run_dir: Path) -> tuple[str, str]:
    wait_for(lambda: (run_dir / "control.json").exists(), what="the control endpoint")
    info = json.loads((run_dir / "control.json").read_text())
    return info["url"], info["token"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("who, fault, action", [
    ("source", "transfer:1:0", "reshape 2,1,1"),          # a rank that sends (and stays) dies mid-stream
    ("destination", "transfer:2:0", "scale-out 4 as 1,2,2"),  # a joiner dies while its shards arrive
])
def test_a_peer_that_dies_mid_transfer_is_one_recovery_from_the_checkpoint(tmp_path, monkeypatch, who, fault, action):
    """The old shards are released as they are sent (bounded memory), so a peer lost mid-stream
    leaves state that no survivor holds whole: one fail-stop, recovered from the latest whole
    checkpoint on the slots left, the event closed with it; every step then runs to the end."""
    monkeypatch.setenv(faults.ENV, fault)
    events = tmp_path / "events.txt"
    events.write_text(f"at step 6: {action}\n")
    rep = liver(tmp_path / "run", "--parallel", "1,2,1", "--slots", "4", "--events", str(events), "--steps", "100000",
                "--end-after-events", "8", "--ckpt-every", "4")
    assert rep["rc"] == 0
    ev, rec, *again = rep["events"]
    victim = int(fault.split(":")[1])
    assert rec["event"]["kind"] == "fail-stop" and f"process [{victim}]" in rec["event"]["source"], rec
    assert rec["status"] == "recovered", rec
    # the event is queued again where it still holds after the recovery (then done), else closed
    assert ev["status"] in ("interrupted by a fail-stop; re-queued", "superseded by the fail-stop recovery"), ev
    assert [(e["event"]["kind"], e["status"], e["digest_equal"]) for e in again] == \
        ([(ev["event"]["kind"], "done", True)] if ev["status"].endswith("re-queued") else [])
    assert rec["restored_step"] % 4 == 0 and 0 <= rec["lost_steps"] <= 8, rec
    assert rec["digest_equal"] is True  # the recovered state is the checkpointed step's, bit for bit
    check_continuous(rep, rep["steps"][-1]["step"])


@pytest.mark.timeout(600)
def test_events_that_arrive_during_a_switch_wait_for_it(tmp_path, monkeypatch):
    """A switch held 2 s inside its transfer: a notice sent meanwhile neither cuts it short nor is
    lost: the reshape completes with its digest kept, then the notice's scale-in, both live,
    nothing rolled back."""
    monkeypatch.setenv(faults.ENV, "slow-transfer:0:2")
    run_dir = tmp_path / "run"
    events = tmp_path / "events.txt"
    events.write_text("at step 3: reshape 2,1,1\n")
    t, box = background(run_dir, "--parallel", "1,2,1", "--slots", "2", "--events", str(events),
                        "--steps", "100000", "--end-after-events", "6", "--ckpt-every", "0")
    url, token = _control(run_dir)
    wait_for(lambda: request(url, token, "GET", "/status")[1]["phase"] == "switch", what="the switch", timeout=120)
    assert request(url, token, "POST", "/scale", {"action": "scale-in 1 deadline 60s"})[0] == 202
    assert request(url, token, "GET", "/status")[1]["phase"] == "switch"  # (still in it: the 2 s hold)
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    assert [(e["event"]["kind"], e["status"]) for e in rep["events"]] == \
        [("reshape", "done"), ("scale-in", "done")], rep["events"]
    assert all(e["digest_equal"] is True for e in rep["events"])
    assert rep["events"][0]["switch_s"] >= 2.0
    check_continuous(rep, rep["steps"][-1]["step"])
    assert len(rep["steps"]) == rep["steps"][-1]["step"]  # no step ran twice


@pytest.mark.timeout(600)
def test_a_full_disk_fails_checkpoints_not_training_and_the_last_whole_one_is_used(tmp_path, monkeypatch):
    """From step 8 on, process 1's checkpoint writes fail with ENOSPC after its files are written:
    no checkpoint from then on is published (DCP's metadata is never written, ``latest.json`` never
    points at one), training goes on, the worker says why; a kill -9 then recovers from step 4, the
    last whole checkpoint, bit for bit."""
    monkeypatch.setenv(faults.ENV, "disk-full:1:8")
    run_dir = tmp_path / "run"
    (tmp_path / "none.txt").write_text("# no events\n")
    t, box = background(run_dir, "--parallel", "1,2,1", "--gpus", "2", "--events", str(tmp_path / "none.txt"),
                        "--steps", "30", "--end-after-events", "-1", "--ckpt-every", "4",
                        "--set", "checkpoint.escalate_after=2")
    log = run_dir / "logs" / "proc1.log"
    wait_for(lambda: log.exists() and "checkpoint of step 12 not written" in log.read_text(), what="a full disk",
             timeout=300)
    assert "No space left on device" in log.read_text()
    assert "the checkpoint of step 4 stands" in log.read_text()  # (it said "the one before" of none too)
    assert json.loads((run_dir / "ckpt" / "latest.json").read_text())["step"] == 4
    # the operator sees it without reading a worker's log: `liver status` (and /metrics) name the
    # newest good checkpoint and the failures since
    url, token = _control(run_dir)
    st = wait_for(lambda: (b := request(url, token, "GET", "/status")[1]).get("checkpoint") and
                  b["checkpoint"]["failures_in_a_row"] >= 2 and b, what="two failures in the status")
    assert st["checkpoint"]["step"] == 4, st
    assert "No space left on device" in st["checkpoint"]["error"]
    code, metrics = 0, ""
    import urllib.request
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        metrics = r.read().decode()
    if "prometheus-client" not in metrics:
        assert "liver_checkpoint_step 4.0" in metrics and "liver_checkpoint_failures_total" in metrics, metrics
    assert not (run_dir / "ckpt" / "step00000008" / ".metadata").exists()
    victim = next(p for p in procs(run_dir) if p["proc"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "recovered" and rec["restored_step"] == 4 and rec["digest_equal"] is True, rec
    assert rec["lost_steps"] == rec["failed_at_step"] - 4 >= 8
    check_continuous(rep, 30)
    # each failure reached the report, saying which checkpoint stands; the second in a row escalated
    failed = [e for e in rep["events"] if e["event"]["kind"] == "checkpoint-failed"]
    assert [e["failures_in_a_row"] for e in failed] == list(range(1, len(failed) + 1)) and len(failed) >= 2, failed
    assert all("the checkpoint of step 4 stands" in e["status"] for e in failed)
    assert not failed[0]["status"].startswith("escalated") and failed[1]["status"].startswith("escalated")


@pytest.mark.timeout(600)
def test_a_full_disk_before_any_checkpoint_says_none_stands(tmp_path, monkeypatch):
    """The very first checkpoint fails: nothing stands, and every message says so (a fail-stop
    now would restart from step 0), not "the one before stands"."""
    monkeypatch.setenv(faults.ENV, "disk-full:0:0")
    (tmp_path / "none.txt").write_text("# no events\n")
    rep = liver(tmp_path / "run", "--parallel", "1,1,1", "--gpus", "1", "--events", str(tmp_path / "none.txt"),
                "--steps", "8", "--end-after-events", "-1", "--ckpt-every", "3", "--digest", "switch")
    assert rep["rc"] == 0
    failed = [e for e in rep["events"] if e["event"]["kind"] == "checkpoint-failed"]
    assert failed and all(e["checkpoint_step"] is None and "no checkpoint stands" in e["status"] for e in failed)
    assert "no checkpoint stands" in (tmp_path / "run" / "logs" / "proc0.log").read_text()


@pytest.mark.timeout(600)
def test_a_leaving_replica_that_dies_while_its_scale_in_prepares_is_healed_and_the_scale_in_goes_on(tmp_path):
    """A process marked to leave still holds its rank until the switch: killed while the scale-in
    prepares, it is a fail-stop at once (not a leaver gone early, which left its peers waiting on
    it for their groups' timeout). It was a data-parallel replica: the survivors heal, nothing is
    rolled back, and the scale-in, queued again, then completes on them."""
    run_dir = tmp_path / "run"
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-in 2 deadline 120s\n")
    t, box = background(run_dir, "--parallel", "1,1,4", "--gpus", "4", "--events", str(events),
                        "--steps", "100000", "--end-after-events", "5", "--ckpt-every", "4")
    url, token = _control(run_dir)
    wait_for(lambda: request(url, token, "GET", "/status")[1]["phase"] == "prepare", what="Prepare", timeout=60)
    victim = next(p for p in procs(run_dir) if p["proc"] == 3)
    os.kill(victim["pid"], signal.SIGKILL)
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    kinds = [(e["event"]["kind"], e["status"].split(";")[0]) for e in rep["events"]]
    # healed; or, where the victim died inside a reduction that some survivors had completed (their
    # steps differ: no one state to heal from), recovered from the checkpoint, the designed fallback
    assert kinds in ([("scale-in", "interrupted by a fail-stop"), ("fail-stop", "healed from the surviving replicas"),
                      ("scale-in", "done")],
                     [("scale-in", "interrupted by a fail-stop"), ("fail-stop", "recovered"), ("scale-in", "done")]), kinds
    heal, done = rep["events"][1], rep["events"][2]
    assert heal["downtime_s"] < 30, heal
    if heal["status"] == "recovered":  # (from step 0 where no checkpoint was written yet: no digest to compare)
        assert heal.get("digest_equal") is not False, heal
    else:
        assert heal["lost_steps"] == 0 and heal["digest_equal"] is True, heal
    assert done["digest_equal"] is True and rep["steps"][-1]["parallel"].endswith("dp2")
    check_continuous(rep, rep["steps"][-1]["step"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("digest", ["step", "switch"])
def test_replicas_that_drift_apart_are_reported_by_the_digest_and_the_job_goes_on(tmp_path, monkeypatch, digest):
    """A framework may let replicas drift (Megatron's TP copies of a norm weight did on GPUs):
    the digest, asked for at every step or at the handoffs only, finds it, says it in the log and
    in the handoff's ``digest_error`` (the summary: NO DIGEST, the exit status 1), and the job
    trains on and hands off as it would have."""
    monkeypatch.setenv(faults.ENV, "drift:1:3")
    events = tmp_path / "events.txt"
    events.write_text("at step 6: scale-in 1\n")
    rep = liver(tmp_path / "run", "--parallel", "1,1,2", "--gpus", "2", "--events", str(events), "--steps", "12",
                "--end-after-events", "-1", "--ckpt-every", "0", *(("--digest", "switch") if digest == "switch" else ()))
    assert rep["rc"] == 1
    (ev,) = rep["events"]
    assert ev["outcome"] == "done" and ev.get("digest_equal") is None, ev
    assert "'layers.0.attn_norm.weight', box [[0, 64]]: the replica of rank 1 differs" in ev["digest_error"], ev
    assert rep["steps"][-1]["step"] == 12
    assert ("digest before: " in ev["digest_error"]) == (digest == "switch")  # (else the step's, at the cut)
