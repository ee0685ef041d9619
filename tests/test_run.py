"""`liver run` end to end: real controller, node agent and worker processes over gloo.

A live run and a `--mode restart` run of the same events (cut at the same steps) train bit for bit
alike; the digest right after each switch equals the one right before it; a joiner killed during
Prepare leaves training on the old generation with nothing lost; a rank killed with SIGKILL is
recovered from the latest periodic checkpoint; bad requests change nothing.
"""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from liver.topology import ParallelConfig

from liver.cli import main
from liver.controller.endpoint import request
from liver.policy.outcome import Outcome, outcome_of


def liver(run_dir: Path, *args: str) -> dict:
    """A run with a state digest after every step (``"--digest", "switch"`` in ``args``: at the
    handoffs only, for tests that compare no step's state); no timeline drawn (a second of CPU a
    run: the test that reads it asks for it); the preparation unpaced unless ``args`` set its
    share (``--companion-share``: a test whose event must meet a Prepare of seconds, as pacing
    makes it, says so; what pacing costs and spares is the benches' to measure); a cold joiner's
    warm-up without training steps on its mock world unless ``args`` ask for some (``--mock-steps``:
    the steps only move first-use costs out of Prepare, which tests do not measure)."""
    paced = any(a == "--companion-share" or a.startswith("prepare.companion_share=") for a in args)
    warmed = any(a in ("--mock-steps", "--warmup-steps") or a.startswith("prepare.mock_steps=") for a in args)
    rc = main(["run", "--run-dir", str(run_dir), "--digest", "--set", "timeline=false",
               *(() if paced else ("--companion-share", "0")), *(() if warmed else ("--mock-steps", "0")), *args])
    report = json.loads((run_dir / "report.json").read_text())
    report["rc"] = rc
    for e in report["events"]:  # what became of each event is a value (liver/policy/outcome.py)
        assert outcome_of(e).value == e["outcome"], e
    return report


def background(run_dir: Path, *args: str) -> tuple[threading.Thread, dict]:
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(report=liver(run_dir, *args)), daemon=True)
    t.start()
    return t, box


def wait_for(cond, timeout=120.0, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def steps_of(run_dir: Path) -> list[dict]:
    f = run_dir / "steps.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def procs(run_dir: Path) -> list[dict]:
    try:
        return json.loads((run_dir / "procs.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def kill_and_recover(run_dir: Path, t: threading.Thread, box: dict, proc: int) -> tuple[dict, dict]:
    """SIGKILL process ``proc`` of the running job; returns the report and its one fail-stop record."""
    victim = next(p for p in procs(run_dir) if p["proc"] == proc)
    os.kill(victim["pid"], signal.SIGKILL)
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    return rep, rec


def check_continuous(report: dict, total: int) -> None:
    """Every step from 1 to total ran in order once, apart from rolled-back ones that re-ran. A step
    that survivors of a heal completed while rank 0, a step behind, did not is trained but has no
    step line: its event's record names it (``steps_unlogged``)."""
    steps = [s["step"] for s in report["steps"]]
    unlogged = {s for e in report["events"] for s in e.get("steps_unlogged", [])}
    assert steps[-1] == total
    assert unlogged.isdisjoint(steps) and sorted(set(steps) | unlogged) == list(range(1, total + 1))


def replays_as_restart(tmp_path: Path, rep: dict, rec: dict, first: str, gpus: int, k: int = 3,
                       extra: tuple[str, ...] = (), mode: str = "restart-forked") -> None:
    """The ``k`` steps after a recovery (``rec``: restored to step S on ``rec["new"]``) equal, bit
    for bit (loss, gradient norm, state digest), those of a ``--mode restart`` run of the same job
    that changes to that layout at step S through a checkpoint: the step re-run after a heal or a
    drop is the step a restart computes. (A recovery onto the layout it left: against the same job
    with no change, whose checkpoint at S holds that state exactly.)"""
    s = rec["restored_step"]
    n = ParallelConfig.from_short(rec["new"])
    spelt = n.spelt()  # (the events' grammar)
    events = tmp_path / "replay-events.txt"
    same = n == ParallelConfig.parse(first)
    events.write_text("# the same layout: no change\n" if same else
                      f"at step {s}: scale-in {n.world_size} as {spelt}\n" if n.world_size < gpus else
                      f"at step {s}: reshape {spelt}\n")
    replay = liver(tmp_path / "replay", "--events", str(events), "--parallel", first, "--gpus", str(gpus),
                   "--steps", str(s + k), "--ckpt-every", "0", "--mode", mode, *extra)
    assert replay["rc"] == 0

    def after(r, gen):
        return [(x["step"], x["parallel"], x["loss"], x["grad_norm"], x["digest"]) for x in r["steps"]
                if s < x["step"] <= s + k and x["generation"] >= gen]

    got, want = after(rep, rec["generation"]), after(replay, 0 if same else 1)
    assert len(want) == k and got == want, (got, want)


@pytest.mark.timeout(600)
def test_live_equals_restart_and_digests_hold(tmp_path):
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-out 4 as 2,1,2          # TP, PP and DP all change, cold joiners\n"
                      "at step +5: reshape 1,2,2:3/1             # in place, uneven pipeline, once that is done\n"
                      "at step +5: scale-in 2 deadline 60s as 2,1,1\n")
    # --connect boundary: the new groups' first collectives wait for an iteration boundary that every
    # member reaches together, the joiners too (gloo's default, background, runs in every other test)
    live = liver(tmp_path / "live", "--events", str(events), "--parallel", "1,2,1", "--steps", "5000",
                 "--end-after-events", "4", "--ckpt-every", "0", "--connect", "boundary")
    total = live["steps"][-1]["step"]
    assert live["rc"] == 0
    assert [e["status"] for e in live["events"]] == ["done"] * 3
    assert [e["new"] for e in live["events"]] == ["tp2pp1dp2", "tp1pp2dp2[3,1]", "tp2pp1dp1"]
    for e in live["events"]:
        assert e["digest_equal"] is True, e
        assert e["bytes_moved"] > 0 and e["prepare_s"] > 0 and e["prepare_stall_s"] >= 0
    assert live["events"][2]["deadline_met"] is True
    # on the same processes (reshape) or a subset (scale-in), the transfer group and any group
    # over the same processes take over the Active World's communicators instead of creating them
    for e in live["events"][1:]:
        assert min(e["comms_shared"].values()) >= 1, e["comms_shared"]
    check_continuous(live, total)
    # the same events by stop-and-restart, cut where the live run switched
    cuts = [e["last_old_step"] for e in live["events"]]
    actions = ["scale-out 4 as 2,1,2", "reshape 1,2,2:3/1", "scale-in 2 deadline 60s as 2,1,1"]
    events2 = tmp_path / "events2.txt"
    events2.write_text("".join(f"at step {c}: {a}\n" for c, a in zip(cuts, actions)))
    # new processes, forked from the job's template as a restart's are (fresh interpreters: the
    # handoffs bench's dry run in tests/test_bench.py)
    for mode in ("restart-forked",):
        restart = liver(tmp_path / mode, "--events", str(events2), "--parallel", "1,2,1", "--steps", str(total),
                        "--ckpt-every", "0", "--mode", mode)
        assert restart["rc"] == 0
        assert [e["last_old_step"] for e in restart["events"]] == cuts
        assert [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in live["steps"]] == \
            [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in restart["steps"]]
        assert all(e["digest_equal"] for e in restart["events"])


@pytest.mark.timeout(600)
def test_joiner_killed_during_prepare_then_next_event_and_control_endpoint(tmp_path):
    events = tmp_path / "events.txt"
    events.write_text("at step 2: scale-out 4\n")
    run_dir = tmp_path / "run"
    t, box = background(run_dir, "--events", str(events), "--parallel", "1,2,1", "--steps", "20000",
                        "--end-after-events", "-1", "--ckpt-every", "0", "--digest", "switch")
    joiner = wait_for(lambda: next((p for p in procs(run_dir) if p["role"] == "joiner" and p["alive"]), None),
                      what="a joiner")
    os.kill(joiner["pid"], signal.SIGKILL)
    # training goes on; the controller re-plans onto the 3 slots left and switches
    wait_for(lambda: any(s["generation"] >= 2 for s in steps_of(run_dir)), what="the re-planned switch")
    info = json.loads((run_dir / "control.json").read_text())
    url, token = info["url"], info["token"]
    # no token, wrong token: refused, nothing queued
    assert request(url, None, "POST", "/scale", {"action": "scale-in 2"})[0] == 401
    assert request(url, "not-the-token", "GET", "/status")[0] == 401
    # invalid configuration: refused with the reason; the job keeps training unchanged
    code, body = request(url, token, "POST", "/scale", {"action": "reshape 3,1,1"})
    assert code == 400 and "tp=3" in body["error"], body
    code, body = request(url, token, "POST", "/scale", {"action": "scale-out 9"})
    assert code == 400 and "gpus=9" in body["error"], body
    status = request(url, token, "GET", "/status")[1]
    assert status["queued"] == 0 and status["phase"] == "stable", status  # refused: never queued
    # a reshape to the layout it already has (the default split of 4 layers over 3 stages)
    code, body = request(url, token, "POST", "/scale", {"action": "reshape 1,3,1:2/1/1"})
    assert code == 202, body
    # the next event still works
    code, body = request(url, token, "POST", "/scale", {"action": "reshape 1,3,1:1/1/2"})
    assert code == 202, body
    wait_for(lambda: any(s["parallel"] == "tp1pp3dp1[1,1,2]" for s in steps_of(run_dir)), what="the reshape")
    code, body = request(url, token, "POST", "/scale", {"action": "scale-in 1 deadline 60s"})
    assert code == 202, body
    wait_for(lambda: any(s["parallel"] == "tp1pp1dp1" for s in steps_of(run_dir)), what="the scale-in")
    code, body = request(url, token, "POST", "/scale", {"action": "scale-out 1"})  # the job has 1 already
    assert code == 400 and "allowed a larger total" in body["error"], body
    assert request(url, token, "POST", "/end", {"after": 3})[0] == 202
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    first = rep["events"][0]
    assert first["status"] == "done" and "died during Prepare" in first["attempts"][0]["cancelled"]
    assert first["gpus"] == 3 and len(first["attempts"]) == 2
    assert [e["status"][:8] for e in rep["events"]] == ["done", "refused:", "done", "done"]
    assert "already runs" in rep["events"][1]["status"]
    assert all(e["digest_equal"] for e in rep["events"] if e["status"] == "done")
    total = rep["steps"][-1]["step"]
    check_continuous(rep, total)  # nothing lost, nothing repeated
    assert len(rep["steps"]) == total


@pytest.mark.timeout(600)
@pytest.mark.parametrize("slots, new, spare", [(2, "tp1pp1dp1", None), (3, "tp1pp2dp1", [2])])
def test_kill9_of_a_rank_recovers_from_the_latest_checkpoint(tmp_path, slots, new, spare):
    """Two pipeline stages: no rank holds a replica of another's, so the checkpoint is the way back.
    On two slots, onto the survivor; on three, the idle slot takes the lost rank's place (every
    process starts afresh anyway: a hot spare), and the job goes on at its size, on its configuration
    (it used to shrink and leave the idle slot idle). The killed rank's slot is not used again."""
    run_dir = tmp_path / "run"
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    t, box = background(run_dir, "--events", str(empty), "--parallel", "1,2,1", "--steps", "24", "--end-after-events", "-1",
                        "--ckpt-every", "4", "--set", f"agent.slots={slots}")
    wait_for(lambda: (run_dir / "ckpt" / "latest.json").exists() and
             json.loads((run_dir / "ckpt" / "latest.json").read_text())["step"] >= 8, what="checkpoint 8")
    rep, rec = kill_and_recover(run_dir, t, box, proc=1)
    assert rec["status"] == "recovered" and rec["new"] == new and rec.get("spare_slots") == spare, rec
    assert rec["lost_slots"] == [1] and "idle_slots" not in rec, rec
    assert rec["restored_step"] % 4 == 0 and rec["restored_step"] >= 8
    assert rec["lost_steps"] == rec["failed_at_step"] - rec["restored_step"] >= 0
    # the recovered state is exactly the checkpointed one
    at_ckpt = [s for s in rep["steps"] if s["step"] == rec["restored_step"] and s["generation"] == 0]
    assert at_ckpt[-1]["digest"] == rec["digest_after"]
    assert rep["steps"][-1]["step"] == 24 and rep["steps"][-1]["generation"] == 1
    replays_as_restart(tmp_path, rep, rec, "1,2,1", 2)


@pytest.mark.timeout(600)
def test_trace_drives_the_job_and_liver_scale_cli_talks_to_it(tmp_path, capsys):
    """A small spot trace (nodes 2 -> 4 -> 3, time-compressed) drives scale events; `liver scale`
    reaches the running job; a malformed trace is refused before anything starts."""
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,n1\r\n0,add,n2\r\n2000,add,n3\r\n2000,add,n4\r\n60000,remove,n4\r\n")
    run_dir = tmp_path / "run"
    t, box = background(run_dir, "--trace", str(trace), "--slots", "4", "--compress", "10", "--notice", "100",
                        "--steps", "20000", "--end-after-events", "60", "--ckpt-every", "0", "--digest", "switch")
    wait_for(lambda: (run_dir / "control.json").exists() and steps_of(run_dir), what="the first steps")
    assert main(["scale", "--run-dir", str(run_dir), "reshape", "9,9,9"]) == 1  # refused by the job
    err = capsys.readouterr().err  # (stdout is the job's, running beside)
    assert "liver: the job refused (400): " in err and "tp" in err
    assert main(["queue", "--run-dir", str(run_dir)]) == 0  # the trace's events, as the job holds them
    listed = json.loads(capsys.readouterr().out)
    assert [q["position"] for q in listed["queued"]] == list(range(1, len(listed["queued"]) + 1))
    assert main(["queue", "--run-dir", str(run_dir), "--withdraw", "99"]) == 1  # no such position: nothing changes
    assert "position=99" in capsys.readouterr().err
    t.join(timeout=500)
    rep = box["report"]
    assert rep["rc"] == 0
    # the trace maps 2 -> 4 -> 3 nodes onto the 4 slots; the scale-in notice (100 s / 10 before the
    # removal at 6 s, not before the previous event at 0.2 s) comes with the scale-out, whose cold
    # joiners take seconds to prepare: the controller's withdrawal holds (nothing was committed)
    # and the notice is merged into it, a scale-out to 3
    kinds = [(e["event"]["kind"], e["status"].split(" (")[0]) for e in rep["events"]]
    assert kinds == [("scale-in", "merged into the pending scale-out"), ("scale-out", "done")], kinds
    assert rep["steps"][-1]["parallel"].startswith("tp1pp3dp1")
    assert all(e.get("deadline_met") is not False for e in rep["events"])
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,n1\n5,remove,n9\n")
    capsys.readouterr()
    assert main(["run", "--run-dir", str(tmp_path / "r2"), "--trace", str(bad)]) == 2
    assert "bad.csv:2: n9 removed but not up" in capsys.readouterr().err
    assert not (tmp_path / "r2" / "steps.jsonl").exists()  # refused before anything started


@pytest.mark.timeout(300)
def test_ctrl_c_ends_the_job_with_one_line_and_its_report(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it: the job stops every process,
    writes report.json and timeline.png, and says so in one line; no traceback anywhere."""
    import subprocess
    import sys
    run_dir = tmp_path / "run"
    # (a terminal's foreground job: SIGINT at its default even where this test runs with it ignored,
    # as a background job of a shell does)
    p = subprocess.Popen([sys.executable, "-m", "liver.cli", "run", "--run-dir", str(run_dir), "--steps", "100000",
                          "--end-after-events", "-1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: len(steps_of(run_dir)) > 8, what="steps")
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # (seen twice on a loaded machine: what it was doing, for its cause)
            p.send_signal(signal.SIGUSR1)
            time.sleep(2)
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError(f"no end 120 s after Ctrl-C; its threads then:\n{err[-6000:]}\n"
                                 f"procs: {procs(run_dir)}") from None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert err.strip().splitlines() == [err.strip()] and "interrupted (Ctrl-C)" in err
    assert "Traceback" not in out + err
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["interrupted"] is True and (run_dir / "timeline.png").exists()
    assert all(not x["alive"] for x in procs(run_dir))


@pytest.mark.timeout(600)
def test_a_deadline_no_handoff_meets_drops_leaving_replicas_at_once(tmp_path):
    """A scale-in whose deadline (0.5 s) no handoff can meet, whose leaving ranks are data-parallel
    replicas: decided before it starts (path "drop"), both leaving processes stop at once (not only
    the first), the survivors go on from their own state (nothing moved, nothing rolled back, the
    digest kept), on the scale-in's own target. One record; no fail-stop, no re-queue."""
    events = tmp_path / "events.txt"
    events.write_text("at step 6: scale-in 2 deadline 0.5s\n")
    # (ends 8 steps after the event: a loop slowed on a loaded machine may see step 6 late, and an
    # event seen once the last step is trained is not reached)
    rep = liver(tmp_path / "run", "--events", str(events), "--parallel", "1,1,4", "--gpus", "4", "--steps", "5000",
                "--end-after-events", "8", "--ckpt-every", "2", "--companion-share", "0.0015")  # (paced, as by default)
    assert rep["rc"] == 0
    (rec,) = rep["events"]
    assert rec["event"]["kind"] == "scale-in" and rec["path"] == "drop", rec
    assert rec["leaving_hold_only_replicas"] is True and rec["bytes_off_leaving"] == 0
    assert rec["predicted_handoff_s"] * 1.5 > 0.5 and rec["predicted_from"] == "model (cpu)"
    assert outcome_of(rec) is Outcome.DROPPED and rec["deadline_met"] is True
    assert rec["lost_steps"] == 0 and rec["digest_equal"] is True and rec["new"] == "tp1pp1dp2", rec
    last = rep["steps"][-1]["step"]
    assert last >= rec["restored_step"] + 8 and rep["steps"][-1]["parallel"] == "tp1pp1dp2"
    assert all(not p["alive"] for p in procs(tmp_path / "run"))
    check_continuous(rep, last)
    # a checkpoint every 2 steps, the newest 3 kept (checkpoint.keep), besides one still being written
    assert len(list((tmp_path / "run" / "ckpt").glob("step*"))) <= 4
    replays_as_restart(tmp_path, rep, rec, "1,1,4", 4)


@pytest.mark.timeout(600)
def test_a_missed_deadline_stops_every_leaving_process_once(tmp_path):
    """A scale-in whose deadline (50 ms) no handoff can meet, whose leaving ranks hold state no
    survivor has (pipeline stages): the handoff is prepared in the foreground from the start (path
    "rush"); at the deadline both leaving processes are stopped, neither counted as a survivor, and
    the job recovers once, from the checkpoint, on the two others: the scale-in's record says its
    deadline was missed, the fail-stop's is the one recovery; the notice is not queued again."""
    events = tmp_path / "events.txt"
    events.write_text("at step 6: scale-in 2 deadline 0.05s\n")
    rep = liver(tmp_path / "run", "--events", str(events), "--parallel", "1,4,1", "--gpus", "4", "--steps", "24",
                "--end-after-events", "-1", "--ckpt-every", "2")
    assert rep["rc"] == 0
    missed = [e for e in rep["events"] if e["event"]["kind"] == "scale-in"]
    assert len(missed) == 1 and missed[0]["path"] == "rush" and missed[0]["leaving_hold_only_replicas"] is False
    assert missed[0]["bytes_off_leaving"] > 0
    if missed[0]["status"] == "done":  # the handoff beat 50 ms after all: nothing to check here
        pytest.skip("the handoff met a 50 ms deadline on this machine")
    assert missed[0]["status"].startswith("deadline missed") and missed[0]["deadline_met"] is False, missed
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    # both leaving slots, neither counted as a survivor (the two stages whose handoff moves fewest
    # bytes: the first ones, the last stage holding the final norm too; processes are slots here)
    assert sorted(rec["lost_slots"]) == sorted(missed[0]["leaving"]) and len(rec["lost_slots"]) == 2
    assert rec["status"] == "recovered" and rec["restored_step"] % 2 == 0 and 0 <= rec["lost_steps"] <= 4, rec
    assert rec["digest_equal"] is True and rec["new"] == missed[0]["new"]
    assert len(rep["events"]) == 2 and rep["steps"][-1]["step"] == 24
    check_continuous(rep, 24)
    replays_as_restart(tmp_path, rep, rec, "1,4,1", 4)


@pytest.mark.timeout(600)
def test_a_notice_behind_a_queued_event_merges_into_the_pending_scale_out_timed_from_its_step(tmp_path):
    """A scheduled notice waits in the file behind a reshape; both trigger while the scale-out's
    cold joiners boot. The notice does not wait its turn (the provider takes the GPUs at its
    deadline): it merges into the pending scale-out, which goes to 3 GPUs; its deadline counts
    from the end of its step, not from when the controller took it. The reshape, to 4 GPUs the job
    no longer has, is refused then."""
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-out 4\n"
                      "at step 4: reshape 2,1,2\n"
                      "at step 5: scale-in 3 deadline 60s\n")
    rep = liver(tmp_path / "run", "--events", str(events), "--parallel", "1,1,2", "--gpus", "2", "--steps", "5000",
                "--end-after-events", "3", "--ckpt-every", "0", "--digest", "switch")
    assert rep["rc"] == 0
    kinds = [(e["event"]["kind"], e["status"]) for e in rep["events"]]
    notice = next(e for e in rep["events"] if e["event"]["kind"] == "scale-in")
    assert notice["status"] == "merged into the pending scale-out (now to 3)", kinds
    out = next(e for e in rep["events"] if e["event"]["kind"] == "scale-out")
    assert out["status"] == "done" and out["gpus"] == 3 and out["digest_equal"] is True, out
    # taken within a bounded time of its step on a machine the ranks keep busy (once 30 s late: the
    # controller's loop was at idle-only priority), and the record says when it was triggered,
    # taken and switched
    assert 0 <= out["taken_after_trigger_s"] < 5.0 and out["t_triggered"] <= out["t_taken"] <= out["switch_end"]
    reshape = next(e for e in rep["events"] if e["event"]["kind"] == "reshape")
    assert reshape["status"].startswith("refused"), reshape
    step5 = next(s for s in rep["steps"] if s["step"] == 5)
    assert abs(notice["arrived"] - step5["time"]) < 0.05, (notice["arrived"], step5["time"])
