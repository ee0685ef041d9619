"""No GPU left, and back: a scale-in to 0 saves the state and the job waits; every process lost
leaves the newest checkpoint standing; a scale-out resumes from the state on disk in the same run;
a new run starts from an earlier run's checkpoint on any layout. Real processes over gloo."""

from __future__ import annotations

import json
import os
import signal

import pytest

from liver.cli import main
from liver.policy.events import parse_trace
from test_run import background, check_continuous, liver, procs, replays_as_restart, wait_for


def test_a_trace_that_drops_to_zero_nodes_becomes_a_scale_in_to_zero_with_its_notice(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,node1\n0,add,node2\n60000,remove,node1\n120000,remove,node2\n300000,add,node3\n")
    events = parse_trace(trace, slots=2, compress=60, notice_s=30)
    assert [(e.kind, e.gpus) for e in events] == [("start", 2), ("scale-in", 1), ("scale-in", 0), ("scale-out", 1)]
    zero = events[2]
    assert zero.deadline_s == pytest.approx(0.5) and zero.at_time == pytest.approx(1.5)


@pytest.mark.timeout(600)
def test_a_scale_in_to_zero_saves_the_state_waits_and_a_scale_out_resumes_it_exactly(tmp_path):
    """The last GPUs' notice: the state of the step the job stopped at goes to disk, every process
    leaves, nothing trains; the next scale-out resumes from it, on its own layout, and every step
    after equals the step a restart through a checkpoint computes."""
    events = tmp_path / "events.txt"
    events.write_text("at step 6: scale-in 0 deadline 60s\nat step 7: scale-out 2 as 1,1,2\n")
    rep = liver(tmp_path / "run", "--events", str(events), "--parallel", "1,2,1", "--gpus", "2", "--steps", "40",
                "--ckpt-every", "0", "--end-after-events", "-1")
    assert rep["rc"] == 0
    gone, back = rep["events"]
    assert gone["status"].startswith("suspended: every GPU gone, its state saved at the notice"), gone
    assert gone["deadline_met"] is True and gone["lost_steps"] == 0
    assert back["status"] == "resumed from the state on disk" and back["new"] == "tp1pp1dp2", back
    s = back["restored_step"]
    assert s == gone["saved_step"] >= 6 and back["lost_steps"] == 0
    before = [x["digest"] for x in rep["steps"] if x["step"] == s and x["generation"] == 0]
    assert before and back["digest_after"] == before[-1]  # the very state it stopped with
    check_continuous(rep, 40)
    assert len(rep["steps"]) == 40  # no step ran twice
    replays_as_restart(tmp_path, rep, back, "1,2,1", 2)


@pytest.mark.timeout(600)
def test_every_process_lost_then_gpus_back_resumes_from_the_checkpoint_and_a_new_run_starts_from_it(tmp_path,
                                                                                                   capsys):
    """Both processes killed: the job does not end, it waits with its newest checkpoint; a
    scale-out over the endpoint resumes it from there. Then another run starts from this run's
    checkpoints on another layout, from the same state; a checkpoint of another model is
    refused before anything starts, naming the field."""
    from liver.controller.endpoint import request
    run_dir = tmp_path / "run"
    (tmp_path / "none.txt").write_text("# no events\n")
    t, box = background(run_dir, "--events", str(tmp_path / "none.txt"), "--parallel", "1,2,1", "--gpus", "2",
                        "--steps", "30", "--ckpt-every", "4", "--end-after-events", "-1",
                        "--set", "agent.slots=2")  # (no idle slot: else the recovery takes them)
    latest = run_dir / "ckpt" / "latest.json"
    wait_for(lambda: latest.exists() and json.loads(latest.read_text())["step"] >= 8, what="checkpoint 8")
    for p in procs(run_dir):
        if p["alive"]:
            os.kill(p["pid"], signal.SIGKILL)
    info = json.loads((run_dir / "control.json").read_text())
    wait_for(lambda: request(info["url"], info["token"], "GET", "/status")[1].get("phase") == "suspended",
             what="the job suspended")
    code, body = request(info["url"], info["token"], "POST", "/scale", {"action": "reshape 2,1,1"})
    assert code == 400 and "no GPU" in body["error"], body  # nothing to reshape: refused, nothing changes
    code, body = request(info["url"], info["token"], "POST", "/scale", {"action": "scale-out 2 as 2,1,1"})
    assert code == 202, body
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    lost = next(e for e in rep["events"] if e["event"]["kind"] == "fail-stop")
    assert lost["status"].startswith("suspended: every process of the job is gone"), lost
    back = next(e for e in rep["events"] if e["status"] == "resumed from the state on disk")
    s = back["restored_step"]
    assert s % 4 == 0 and s >= 8 and back["new"] == "tp2pp1dp1" and back["checkpoint"] == lost["checkpoint"]
    at_ckpt = [x["digest"] for x in rep["steps"] if x["step"] == s and x["generation"] == 0]
    assert at_ckpt[-1] == back["digest_after"]
    assert rep["steps"][-1]["step"] == 30
    # a new job from this run's checkpoints (its newest whole one), on a layout of its own
    newest = json.loads(latest.read_text())
    rep2 = liver(tmp_path / "run2", "--events", str(tmp_path / "none.txt"), "--parallel", "1,1,2", "--gpus", "2",
                 "--steps", str(newest["step"] + 2), "--ckpt-every", "0", "--end-after-events", "-1",
                 "--from-checkpoint", str(run_dir / "ckpt"))
    assert rep2["rc"] == 0
    first = rep2["steps"][0]
    assert first["step"] == newest["step"] + 1 and first["parallel"] == "tp1pp1dp2"
    (start,) = rep2["events"]
    assert start["restored_step"] == newest["step"] and start["new"] == "tp1pp1dp2"
    saved = [x["digest"] for x in rep["steps"] if x["step"] == newest["step"]]
    assert start["digest_after"] == saved[-1]  # the state it was saved with, resharded (the digest is layout-free)
    capsys.readouterr()
    assert main(["run", "--run-dir", str(tmp_path / "run3"), "--set", "job.model.hidden_size=128",
                 "--from-checkpoint", str(run_dir / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.start_from=" in err and "shape" in err and "Traceback" not in err
    assert main(["run", "--run-dir", str(tmp_path / "run4"), "--from-checkpoint", str(tmp_path)]) == 2
    assert "checkpoint.start_from=" in capsys.readouterr().err
