"""The controller's decisions, driven in this process (``fake_job``): a real controller over an
in-memory store and a node whose processes the test plays, the ranks' side of the protocol written
by the test; one pass of the controller's loop at a time. Milliseconds each; every path that the
multi-process tests reach only by timing is reached here by construction."""

import json

import pytest

from fake_job import FakeNode, controller, run_until
from liver.controller.controller import Controller
from liver.controller.phases import PENDING, Phase
from liver.policy.outcome import Outcome
from liver.protocol.messages import Wish, read
from liver.protocol.store import COMMIT, WITHDRAW, decided
from liver.topology import ParallelConfig


def outcomes(ctl):
    return [r.outcome for r in ctl.state.records]


def pending_scale_out(tmp_path, to: int = 4, **cfg):
    """A job on 2 GPUs whose scale-out to ``to`` is preparing (joiners started, nothing ready)."""
    ctl, node, ranks = controller(tmp_path, f"at step 3: scale-out {to}\n", **cfg)
    run_until(ctl, lambda: ctl.state.phase is Phase.PREPARE, ranks, step=3)
    return ctl, node, ranks


def switch(ctl, ranks, step: int) -> None:
    """The ranks prepare, commit and switch the pending generation; the controller closes it."""
    ranks.ready()
    ctl.once()
    assert ranks.commit() == COMMIT
    ranks.switched(step)
    run_until(ctl, lambda: ctl.state.phase is Phase.STABLE and ctl.state.current is None)


def test_a_scale_out_prepares_with_cold_joiners_switches_and_is_done(tmp_path):
    ctl, node, ranks = pending_scale_out(tmp_path)
    g = ctl.state.pending.generation
    assert [(p, role) for p, role, gen in node.started if gen == g] == [(2, "joiner"), (3, "joiner")]
    assert ranks.wish().wanted == g  # the ranks are told to prepare it
    assert ctl.state.members == [0, 1, 2, 3]
    switch(ctl, ranks, step=4)
    assert ctl.state.active.generation == g and ctl.state.active.parallel.world_size == 4
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.DONE and rec["joiners"] == [2, 3] and rec["switch_s"] == 0.01


def test_a_step_trigger_seen_late_is_timed_from_the_step_in_the_log(tmp_path):
    """A controller that looks only after the step ends its record carries have moved on (a loop
    slowed down on a loaded machine) takes the trigger's time from rank 0's log of steps, not
    from the latest step counted back."""
    ctl, node, ranks = controller(tmp_path, "at step 3: scale-out 4\n")
    g = ctl.state.active.generation
    (tmp_path / "steps.jsonl").write_text("".join(
        json.dumps({"step": k, "generation": g, "time": 1000.0 + k}) + "\n" for k in range(1, 300)) + '{"step": 3')
    ranks.step(299)  # (its record's ends: none)
    run_until(ctl, lambda: ctl.state.phase is Phase.PREPARE)
    assert ctl.state.current.event.arrived == 1003.0


def test_an_event_seen_only_once_the_last_step_is_trained_is_not_reached_and_the_job_ends(tmp_path):
    """A loop slowed on a loaded machine looks after the ranks trained their last step: the event
    (due long before) does not begin, which would stop ranks that are ending and take their clean
    exits for a failure; the job ends and the event is not reached."""
    ctl, node, ranks = controller(tmp_path, "at step 6: scale-in 1 deadline 0.5s\n", heal_timeout_s=5.0)
    steps = ctl.cfg.steps
    ranks.step(steps)
    for _ in range(3):
        ctl.once()
    assert ctl.state.current is None and ctl.state.phase is Phase.STABLE and len(ctl.state.queue) == 1
    for p in ctl.state.active.procs:
        node.exit(p, 0)
    run_until(ctl, lambda: ctl.finished)
    assert all(w.returncode == 0 for w in node.workers.values()) and len(node.workers) == 2
    assert ctl.state.records == [] and len(ctl.state.queue) == 1  # (the report: "not reached")


@pytest.mark.parametrize("notice, kept, then", [
    (3, "merged", None),                # more than the job has: the scale-out re-planned to 3
    (1, "cancelled", Outcome.STARTED),  # fewer: the scale-out dropped, the scale-in begins next
    (2, "cancelled", Outcome.DONE),     # as many as it has: dropped, nothing else to do
])
def test_a_notice_during_prepare_merges_drops_or_goes_first(tmp_path, notice, kept, then):
    ctl, node, ranks = pending_scale_out(tmp_path)
    g = ctl.state.pending.generation
    ctl.events.submit(f"scale-in {notice} deadline 60s")
    ranks.step(4)
    ctl.once()
    assert decided(ctl.store, g) == WITHDRAW  # nothing committed: nothing is lost
    assert all(node.workers[p].returncode is not None for p in (2, 3)) or kept == "merged"
    if kept == "merged":
        assert outcomes(ctl) == [Outcome.MERGED]
        assert ctl.state.phase is Phase.PREPARE and ctl.state.pending.generation == g + 1
        assert ctl.state.pending.parallel.world_size == 3  # the same scale-out, to the notice's total
        switch(ctl, ranks, step=5)
        assert outcomes(ctl) == [Outcome.MERGED, Outcome.DONE]
    else:
        assert outcomes(ctl)[0] is Outcome.CANCELLED
        if then is Outcome.DONE:
            assert outcomes(ctl) == [Outcome.CANCELLED, Outcome.DONE] and ctl.state.phase is Phase.STABLE
        else:  # the scale-in is in flight now, its leaving rank chosen
            assert ctl.state.current.event.gpus == 1 and len(ctl.state.current.leaving) == 1


def test_a_withdrawn_event_never_runs_and_one_that_would_leave_the_queue_invalid_is_refused(tmp_path):
    ctl, node, ranks = controller(tmp_path, "at step 50: scale-out 4\nat step 60: scale-in 3\n")
    ranks.step(1)
    ctl.once()
    with pytest.raises(ValueError, match=r"would leave #2 invalid: .*scale-in 3: the job will have 2 GPUs"):
        ctl.events.withdraw(1)  # the scale-in to 3 needs the scale-out's 4 before it
    assert len(ctl.state.queue) == 2
    ctl.events.withdraw(2)
    ctl.events.withdraw(1)
    assert outcomes(ctl) == [Outcome.WITHDRAWN, Outcome.WITHDRAWN] and not ctl.state.queue
    for step in (50, 60, 70):
        ranks.step(step)
        ctl.once()
    assert ctl.state.current is None and ctl.state.gen == 0


def test_a_joiner_that_dies_in_prepare_cancels_and_re_plans_on_the_slots_left(tmp_path):
    ctl, node, ranks = pending_scale_out(tmp_path)
    g = ctl.state.pending.generation
    node.exit(2, 1)
    ranks.step(4)
    ctl.once()
    assert decided(ctl.store, g) == WITHDRAW and 2 in ctl.state.lost_slots
    assert ctl.state.phase is Phase.PREPARE and ctl.state.pending.generation == g + 1
    assert ctl.state.pending.parallel.world_size == 3  # slot 2 is lost: 3 of the 4 asked
    switch(ctl, ranks, step=5)
    rec = ctl.state.records[-1]
    assert rec.outcome is Outcome.DONE and [a.get("cancelled") for a in rec["attempts"]][0].startswith("joiner 2")


def test_a_preparation_a_process_failed_is_tried_once_more_then_cancelled(tmp_path):
    """A process's report that its groups timed out (ranks held by a withdrawn generation's
    rendezvous, say) withdraws the generation and prepares the event once more, anew; a second
    such failure, or any other, cancels it, and the job trains on in its Active World."""
    from liver.controller.live import PREPARE_ATTEMPTS
    from liver.protocol.messages import Failure, write

    ctl, node, ranks = pending_scale_out(tmp_path)
    for attempt in range(1, PREPARE_ATTEMPTS + 1):
        g = ctl.state.pending.generation
        write(ctl.store, Failure.key(g, 0), Failure(proc=0, generation=g, error="TimeoutError: processes [0, 1] "
                                                                              "did not arrive within 45 s"))
        ranks.step(3 + attempt)
        ctl.once()
        assert decided(ctl.store, g) == WITHDRAW
        if attempt < PREPARE_ATTEMPTS:
            assert ctl.state.phase is Phase.PREPARE and ctl.state.pending.generation == g + 1
    rec = ctl.state.records[-1]
    assert ctl.state.current is None and rec.outcome is Outcome.CANCELLED and len(rec["attempts"]) == PREPARE_ATTEMPTS
    assert all("did not arrive" in a["cancelled"] for a in rec["attempts"])
    # any other failure (a plan refused as not the job's, say) cancels at once
    ctl, node, ranks = pending_scale_out(tmp_path / "again")
    g = ctl.state.pending.generation
    write(ctl.store, Failure.key(g, 0), Failure(proc=0, generation=g, error="ValueError: plan/1: not sealed"))
    ranks.step(4)
    ctl.once()
    assert ctl.state.current is None and ctl.state.records[-1].outcome is Outcome.CANCELLED


def test_a_joiner_that_cannot_be_started_cancels_its_handoff_and_the_job_trains_on(tmp_path, monkeypatch):
    def refuse(self, proc, slot, role, generation):
        if role == "joiner":
            raise RuntimeError("the template did not fork within agent.start_timeout_s")
        return start(self, proc, slot, role, generation)
    start = FakeNode.start
    monkeypatch.setattr(FakeNode, "start", refuse)
    ctl, node, ranks = controller(tmp_path, "at step 3: scale-out 4\n")
    run_until(ctl, lambda: ctl.state.current is None and ctl.state.records, ranks, step=3)
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.CANCELLED and "could not be started" in rec.status
    assert ctl.state.phase is Phase.STABLE and ctl.state.active.generation == 0  # training on
    assert ranks.wish().wanted == 0


def test_a_notice_too_short_for_a_handoff_drops_replicas_and_the_survivors_heal(tmp_path):
    # (the model predicts about 0.9 s for this handoff on CPU processes, 1.5 times over is more than 1.2 s)
    ctl, node, ranks = controller(tmp_path, "at step 3: scale-in 1 deadline 1.2s\n", heal_timeout_s=5.0)
    g = ctl.state.gen
    ranks.stalled([0, 1], step=3)  # the survivor stops at its boundary, then switches into the heal
    ranks.switch_into(g + 1, [0, 1], step=3)  # (the drop heals within one pass: written ahead)
    run_until(ctl, lambda: ctl.state.records, ranks, step=3)
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.DROPPED and rec["path"] == "drop" and rec["leaving_hold_only_replicas"]
    assert rec["deadline_met"] and rec["lost_steps"] == 0 and rec["restored_step"] == 3
    assert rec["predicted_handoff_s"] * 1.5 > 1.2 and [w.returncode for w in node.workers.values()].count(-9) == 1
    assert ctl.state.active.generation == g + 1 and ctl.state.active.kind == "heal"
    assert ctl.state.active.parallel.world_size == 1 and ctl.state.phase is Phase.STABLE


def test_a_drop_whose_survivors_cannot_heal_recovers_from_the_checkpoint_and_the_report_reads_both_records(tmp_path):
    """The survivors never report (they exited, or hung): the scale-in's record says it recovered,
    the fail-stop's after it carries the new generation; the report's digests of recoveries read
    only the latter (a KeyError on the first ended a job, before)."""
    ctl, node, ranks = controller(tmp_path, "at step 3: scale-in 1 deadline 1.2s\n", heal_timeout_s=0.3)
    run_until(ctl, lambda: ctl.state.records, ranks, step=3)
    assert outcomes(ctl) == [Outcome.RECOVERED, Outcome.RECOVERED]
    drop, rec = ctl.state.records
    assert drop["path"] == "drop" and drop.get("generation") is None and rec["generation"] == ctl.state.active.generation
    ctl._recovery_digests()
    assert rec["digest_after"] is None


def test_a_scale_in_is_predicted_at_the_rate_the_jobs_own_transfers_showed(tmp_path):
    """The job's earlier handoff among running processes moved 1 MiB through one process in 2 s (a
    slow link): a scale-in whose deadline a fast link would meet is predicted at that rate, and takes
    the path that keeps its state in time (a rush: its leaving rank holds state no one else has)."""
    from liver.controller.records import EventRecord

    ctl, node, ranks = controller(tmp_path, "at step 3: scale-in 1 deadline 3s\n", parallel=ParallelConfig(tp=2))
    ctl.state.records.append(EventRecord.of({"kind": "reshape"}, Outcome.DONE, prepare_s=0.1, switch_s=2.05,
                                            transfer_s=2.0, max_rank_bytes_in=1 << 20, max_rank_bytes_out=0,
                                            joiners=[]))
    run_until(ctl, lambda: ctl.state.current is not None, ranks, step=3)
    rec = ctl.state.current.record
    moved = max(rec["max_rank_bytes_in"], rec["max_rank_bytes_out"])
    assert moved > 0 and rec["predicted_from"] == "measured"
    assert rec["predicted_handoff_s"] == pytest.approx(0.15 + moved / ((1 << 20) / 2.0))
    assert rec["path"] == "rush" and rec["predicted_handoff_s"] * 1.5 > 3


def test_a_rush_whose_deadline_passes_recovers_on_the_survivors_from_the_checkpoint(tmp_path):
    ctl, node, ranks = controller(tmp_path, "at step 3: scale-in 1 deadline 0.2s\n", parallel=ParallelConfig(tp=2))
    run_until(ctl, lambda: ctl.state.phase in PENDING, ranks, step=3)
    h = ctl.state.current
    assert h.record["path"] == "rush" and h.forced and ranks.wish().force == ctl.state.pending.generation
    leaving = h.leaving
    run_until(ctl, lambda: ctl.state.current is None, ranks, step=4, passes=10_000)
    assert outcomes(ctl) == [Outcome.DEADLINE_MISSED, Outcome.RECOVERED]
    assert all(node.workers[p].returncode is not None for p in leaving)
    rec = ctl.state.records[-1]
    assert ctl.state.active.kind == "recover" and ctl.state.active.parallel.world_size == 1
    assert rec["restored_step"] == 0 and rec["checkpoint"] is None  # no checkpoint stands: from step 0


def test_a_rank_lost_with_replicas_left_heals_without_the_checkpoint(tmp_path):
    ctl, node, ranks = controller(tmp_path, heal_timeout_s=5.0)
    ranks.step(7)
    ctl.once()
    g = ctl.state.gen
    ranks.stalled([0], step=7)
    ranks.switch_into(g + 1, [0], step=7)
    node.exit(1, -9)
    ctl.once()
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.HEALED and rec["lost_steps"] == 0 and rec["restored_step"] == 7
    assert rec["checkpoint"] is None and rec["digest_after"] == "after"
    assert ctl.state.active.generation == g + 1 and ctl.state.active.procs == (0,)


def test_a_rank_lost_without_replicas_recovers_from_the_checkpoint_on_fresh_processes(tmp_path):
    ctl, node, ranks = controller(tmp_path, parallel=ParallelConfig(tp=2))
    ranks.step(7)
    ctl.once()
    node.exit(1, -9)
    ctl.once()
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.RECOVERED and rec["lost_steps"] == 7 and rec["failed_at_step"] == 7
    assert ctl.state.active.kind == "recover" and set(ctl.state.active.procs).isdisjoint({0, 1})
    assert node.workers[0].returncode is not None  # every process of the broken generation stopped


@pytest.mark.parametrize("slots", [6, 8])
def test_a_recovery_whose_survivors_no_configuration_uses_all_of_runs_on_fewer_and_leaves_the_rest_idle(tmp_path, slots):
    """Five survivors of tp1pp3dp2 (a 4-layer model, batch 8: no configuration of 5 GPUs): the
    recovery from the checkpoint runs on the best configuration of fewer of them, the first in slot
    order, and says which slots it left idle (before: the controller stopped on the ValueError).
    With idle slots (8 slots, 6 ranks), one takes the lost rank's place instead: every process starts
    afresh anyway (a hot spare), so the job goes on at its size, on its configuration; the lost slot
    is not used again, the other idle one stays idle."""
    ctl, node, ranks = controller(tmp_path, parallel=ParallelConfig(tp=1, pp=3, dp=2), slots=slots, heal_timeout_s=0)
    ranks.step(7)
    ctl.once()
    node.exit(5, -9)
    ctl.once()
    (rec,) = ctl.state.records
    new = ParallelConfig.from_short(rec["new"])
    used = sorted(ctl.state.slot_of[p] for p in ctl.state.active.procs)
    assert rec.outcome is Outcome.RECOVERED and ctl.state.active.parallel == new and rec["lost_slots"] == [5], rec
    if slots == 6:
        assert new.world_size < 5 and len(used) == new.world_size and "spare_slots" not in rec, rec
        assert used + rec["idle_slots"] == [0, 1, 2, 3, 4]
    else:
        assert rec["new"] == rec["old"] == "tp1pp3dp2" and rec["spare_slots"] == [6] and "idle_slots" not in rec, rec
        assert used == [0, 1, 2, 3, 4, 6]


def test_a_recovery_keeps_the_slots_of_processes_that_ended_because_a_peer_vanished(tmp_path):
    """One process killed (its slot goes); its peers exit with an error of a broken collective
    (their slots are healthy): the recovery uses every healthy slot, not only the processes
    still alive when it looked."""
    ctl, node, ranks = controller(tmp_path, parallel=ParallelConfig(tp=2, dp=2), heal_timeout_s=0)
    ranks.step(7)
    ctl.once()
    node.exit(1, -9)
    node.exit(0, 1)
    node.exit(3, 1)
    ctl.once()
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.RECOVERED and rec["lost_slots"] == [1]
    assert ctl.state.active.parallel.world_size == 3
    assert sorted(ctl.state.slot_of[p] for p in ctl.state.active.procs) == [0, 2, 3]


@pytest.mark.parametrize("codes, lost", [
    ((-9, 1, 1), {0}),              # a kill and its victims: only the killed slot
    ((-1000, 1), {0}),              # a node lost (NODE_LOST) and a victim
    ((1, 1), {0, 1}),               # errors of their own, no outside cause: all (a bug's)
    ((1,), {0}),
])
def test_which_slots_a_fail_stop_takes_out_of_use(codes, lost):
    from liver.agent.node import Worker
    from liver.controller.failures import lost_slots

    dead = [Worker(p, p, "start", 0, 0, 0.0) for p in range(len(codes))]
    for w, c in zip(dead, codes):
        w.returncode = c
    assert lost_slots(dead) == lost
    assert lost_slots(dead[1:], silent={0}) == {0}  # (a silent node's slots are the cause)


def test_a_member_lost_during_the_switch_is_one_fail_stop_from_the_checkpoint(tmp_path):
    ctl, node, ranks = pending_scale_out(tmp_path)
    ranks.ready()
    ctl.once()
    assert ranks.commit() == COMMIT
    ctl.once()
    assert ctl.state.phase is Phase.SWITCH
    node.exit(3, -9)  # a joiner receiving its shards
    ctl.once()
    assert outcomes(ctl) == [Outcome.REQUEUED, Outcome.RECOVERED]  # the scale-out, queued again after it
    assert ctl.state.active.kind == "recover" and ctl.state.queue[0].gpus == 4
    assert all(w.returncode is not None for p, w in node.workers.items() if p <= 3)


def journaled(ctl, run_dir):
    """What ``liver controller --resume`` reads: ``ctl``'s journal as its loop writes it (the
    state snapshot under its locks, the bytes written after), read back from ``run_dir``."""
    from liver.controller import journal
    identity = {"cfg": ctl.cfg, "mode": ctl.mode.name, "token": ctl.token, "url": "http://x:1", "store_pid": None,
                "store_addr": "in-process"}
    j = journal.Journal(run_dir, ctl.master)
    with ctl.lock, ctl.nodes.lock:
        blob = j.snapshot(ctl.state, ctl.nodes, identity)
    assert blob is not None and j.snapshot(ctl.state, ctl.nodes, identity) is None  # (unchanged: not again)
    j.write(blob)
    return journal.read(run_dir)


def test_a_controller_resumed_mid_prepare_withdraws_and_queues_the_event_again(tmp_path):
    ctl, node, ranks = pending_scale_out(tmp_path)
    g = ctl.state.pending.generation
    again = Controller(ctl.cfg, [], tmp_path, resume=journaled(ctl, tmp_path), store=ctl.master, node=node)
    again.start()
    assert decided(again.store, g) == WITHDRAW and again.state.phase is Phase.STABLE
    assert outcomes(again) == [Outcome.REQUEUED] and again.state.queue[0].gpus == 4
    assert read(again.store, Wish.KEY, Wish).wanted == 0


def test_a_controller_resumed_after_the_commit_watches_the_switch_to_its_end(tmp_path):
    ctl, node, ranks = pending_scale_out(tmp_path)
    ranks.ready()
    ctl.once()
    assert ranks.commit() == COMMIT
    again = Controller(ctl.cfg, [], tmp_path, resume=journaled(ctl, tmp_path), store=ctl.master, node=node)
    again.start()
    ranks = type(ranks)(again)
    assert again.state.phase is Phase.SWITCH
    ranks.switched(4)
    run_until(again, lambda: again.state.current is None)
    assert outcomes(again) == [Outcome.DONE]


# ---- restart mode ------------------------------------------------------------------------------
def test_restart_mode_announces_a_step_trigger_ahead_stops_there_and_restarts_from_the_save(tmp_path):
    ctl, node, ranks = controller(tmp_path, "at step 5: scale-out 4\n", mode="restart")
    ranks.step(2)
    ctl.once()
    assert ranks.wish().stop_at == 5  # known ahead: the ranks stop exactly after step 5, not one later
    run_until(ctl, lambda: ctl.state.phase is Phase.STOP, ranks, step=5)
    assert ranks.wish().stop_at == 5 and ctl.state.announced_at is None
    ranks.saved(str(tmp_path / "handoff"), step=5)
    ctl.once()
    assert ctl.state.phase is Phase.START and ctl.state.active.kind == "restart"
    assert ctl.state.active.load_from == str(tmp_path / "handoff") and len(ctl.state.active.procs) == 4
    assert set(ctl.state.active.procs).isdisjoint({0, 1})  # fresh processes, every one
    ranks.started_all(step=5)
    ctl.once()
    (rec,) = ctl.state.records
    assert rec.outcome is Outcome.DONE and rec["digest_before"] == "before" and rec["digest_after"] == "after"
    assert rec["load_s"] == 0.5 and ctl.state.phase is Phase.STABLE


def test_restart_mode_two_events_at_one_step_each_stop_the_job(tmp_path):
    """The second event's step was announced for the first: it stops the new generation anew."""
    ctl, node, ranks = controller(tmp_path, "at step 5: scale-out 4\nat step 5: reshape 2,2,1\n", mode="restart")
    run_until(ctl, lambda: ctl.state.phase is Phase.STOP, ranks, step=5)
    ranks.saved(str(tmp_path / "h1"), step=5)
    ctl.once()
    ranks.started_all(step=5)
    ranks.step(5)
    ctl.once()
    run_until(ctl, lambda: ctl.state.phase is Phase.STOP, ranks, step=5)
    assert ranks.wish().stop_at == 6  # (the next boundary of the new generation)
    ranks.saved(str(tmp_path / "h2"), step=6)
    ctl.once()
    ranks.started_all(step=6)
    ctl.once()
    assert outcomes(ctl) == [Outcome.DONE, Outcome.DONE] and ctl.state.active.parallel.short() == "tp2pp2dp1"


def test_a_scale_in_to_no_gpu_saves_suspends_and_a_scale_out_resumes_from_the_save(tmp_path):
    """Every GPU's notice: the state saved at the next boundary, every process let go, the job
    suspended (``suspension.py``); the next scale-out resumes it from that save on fresh
    processes; with nothing else queued, the records say each step."""
    ctl, node, ranks = controller(tmp_path, "at step 3: scale-in 0 deadline 60s\nat step 3: scale-out 2\n")
    run_until(ctl, lambda: ctl.state.suspending, ranks, step=3)
    assert ranks.wish().stop_at == 4 and all(node.workers[p].leaving for p in ctl.state.active.procs)
    ranks.step(4)
    ranks.saved(str(tmp_path / "saved"), step=4)
    ctl.once()
    assert ctl.state.phase is Phase.SUSPENDED and ctl.state.suspended["step"] == 4
    ctl.once()  # (a scale-out is queued: it resumes the job)
    assert ctl.state.phase is Phase.STABLE and ctl.state.suspended is None
    assert ctl.state.active.kind == "resume" and ctl.state.active.load_from == str(tmp_path / "saved")
    suspended, resumed = ctl.state.records
    assert suspended.outcome is Outcome.SUSPENDED and suspended["saved_step"] == 4 and suspended["deadline_met"]
    assert resumed.outcome is Outcome.RESUMED and resumed["restored_step"] == 4 and resumed["lost_steps"] == 0


@pytest.mark.parametrize("slots", [2, 4])
def test_every_process_lost_at_once_suspends_on_the_newest_checkpoint(tmp_path, slots):
    """Every process killed at once (no survivor, no error of their own): the job waits with the
    newest checkpoint (none here: from step 0), and ends with no GPU when nothing queued would
    bring one back. Where idle slots are left (4 slots, 2 ranks), the recovery starts on them."""
    ctl, node, ranks = controller(tmp_path, slots=slots)
    ranks.step(5)
    ctl.once()
    for p in list(ctl.state.active.procs):
        node.exit(p, -9)
    ctl.once()
    lost, = [r for r in ctl.state.records if r.event.get("kind") == "fail-stop"]
    assert lost["lost_steps"] == 5 and lost["checkpoint"] is None
    if slots == 2:
        assert ctl.state.phase is Phase.SUSPENDED and lost.outcome is Outcome.SUSPENDED
        assert ctl.state.suspended["path"] is None and ctl.state.suspended["step"] == 0
    else:
        assert ctl.state.phase is not Phase.SUSPENDED and lost.outcome is Outcome.RECOVERED, lost
        assert lost["spare_slots"] == [2, 3] and sorted(ctl.state.slot_of[p] for p in ctl.state.active.procs) == [2, 3]


def test_every_mode_the_configuration_allows_is_a_strategy_the_controller_runs(tmp_path):
    """``controller.mode`` is checked against names the configuration keeps (it imports no
    controller); each is a ``Mode`` of that name, and a controller holds the one its job names."""
    from liver.controller.config import MODES as ALLOWED
    from liver.controller.mode import Mode
    from liver.controller.modes import MODES

    assert set(MODES) == set(ALLOWED) and all(issubclass(m, Mode) and m.name == n for n, m in MODES.items())
    for name in ALLOWED:
        ctl, _, _ = controller(tmp_path / name, mode=name)
        assert type(ctl.mode) is MODES[name] and ctl.status()["mode"] == name


def test_a_lost_node_that_registers_again_during_its_own_fail_stop_is_a_new_node_and_the_job_goes_on(tmp_path, caplog):
    """A node's agent goes silent: its ranks' fail-stop begins, and while it is handled the node
    registers again under its name (its agent restarted: another pid). The newcomer is a new node
    with slots of its own, offered to the job; the fail-stop finds, names and stops the old node's
    processes and heals the survivors; the controller and the job go on (before, the old node left
    the job's table mid fail-stop and the controller died on a KeyError)."""
    import logging
    caplog.set_level(logging.INFO, logger="liver.controller")  # (the phase lines: the node that joined)
    import time as clock

    from liver.controller.nodes import RemoteNode
    from liver.policy.events import EventKind
    from liver.protocol.agent import Register

    ctl, node, ranks = controller(tmp_path, slots=2, heal_timeout_s=5.0, agent_timeout_s=4.0)
    ranks.step(3)
    ctl.once()
    ctl.membership.register(Register(node="n1", slots=2, host="vm-1", pid=41))  # joins: "now", onto its slots
    run_until(ctl, lambda: ctl.state.phase is Phase.PREPARE, ranks, step=4)
    remote = ctl.nodes.nodes["n1"]
    assert sorted(p for p, role, g in node.started) == [0, 1] and len(remote.workers) == 2
    switch(ctl, ranks, step=5)
    assert ctl.state.active.parallel.world_size == 4
    ranks.step(6)
    ctl.once()

    g = ctl.state.gen
    survivors = [p for p in ctl.state.active.procs if p not in remote.workers]
    real_exits = ctl.failures.exits

    def registers_meanwhile(gone):  # the endpoint's thread, while the loop handles the fail-stop
        ctl.membership.register(Register(node="n1", slots=2, host="vm-1", pid=42))
        return real_exits(gone)

    ctl.failures.exits = registers_meanwhile
    ranks.stalled(survivors, step=6)  # the survivors stop at their boundary, then switch into the heal
    ranks.switch_into(g + 1, survivors, step=6)
    remote.last_seen = remote.last_heard = clock.time() - 60  # silent for longer than agent_timeout_s
    ctl.once()

    new = ctl.nodes.nodes["n1"]
    assert new is not remote and isinstance(new, RemoteNode) and not new.lost
    assert new.slot_base != remote.slot_base
    assert remote.lost and all(w.returncode is not None for w in remote.workers.values())
    (scale_out, rec) = ctl.state.records
    assert scale_out.outcome is Outcome.DONE and rec.outcome is Outcome.HEALED and rec["lost_steps"] == 0
    assert ctl.state.active.generation == g + 1 and ctl.state.active.procs == tuple(survivors)
    (again,) = ctl.state.queue  # the newcomer's slots, offered to the job (on_join "now")
    assert again.kind is EventKind.SCALE_OUT and again.gpus == 4 and again.source == "node n1 joined"
    # the terminal says why a scale-out nobody scheduled comes: the node, the join policy
    joined = [r.fields for r in caplog.records if r.getMessage() == "node-joined"]
    assert joined and joined[0]["node"] == "n1" and joined[0]["policy"] == "now" and joined[0]["scale_out_to"] == 4, joined
    run_until(ctl, lambda: ctl.state.phase is Phase.PREPARE, ranks, step=7)  # the loop goes on, onto them
    assert {ctl.state.slot_of[p] for p in ctl.state.pending.procs if p not in survivors} == \
        set(range(new.slot_base, new.slot_base + 2))


def test_a_notice_whose_node_leaves_a_count_no_configuration_uses_scales_in_to_the_best_on_fewer(tmp_path):
    """Six processes on the local node (tp1pp3dp2, a 4-layer model, batch 8) and one on n1 after
    it joins: eight. n1's notice would leave seven, and no configuration of 7 exists. The scale-in
    goes to the best configuration of fewer GPUs: n1's process and the most recently added of the
    rest leave, live, within the notice (before: the handoff was refused, and the node's loss at
    its deadline was a fail-stop)."""
    from liver.config.fields import to_dict
    from liver.protocol.agent import Notice, Register, Sync

    ctl, node, ranks = controller(tmp_path, slots=7, parallel=ParallelConfig(tp=1, pp=3, dp=2))
    ranks.step(3)
    ctl.once()
    ctl.membership.register(Register(node="n1", slots=1, host="vm-1", pid=41))  # joins "now": 8 GPUs
    run_until(ctl, lambda: ctl.state.phase is Phase.PREPARE, ranks, step=4)
    switch(ctl, ranks, step=5)
    assert ctl.state.active.parallel.world_size == 8
    ranks.step(6)
    ctl.once()
    on_n1 = [p for p in ctl.state.active.procs if ctl.nodes.node_of(ctl.state.slot_of[p]).name == "n1"]
    assert len(on_n1) == 1
    ctl.membership.agent_request("sync", to_dict(Sync(node="n1", notice=Notice(source="test", deadline_s=60.0))))
    run_until(ctl, lambda: ctl.state.phase is Phase.PREPARE, ranks, step=7)
    h = ctl.state.current
    assert h.target.world_size < 7 and set(on_n1) <= set(h.leaving), (h.target, h.leaving)
    assert len(h.leaving) == 8 - h.target.world_size
    assert ctl.state.pending.parallel == h.target and not set(ctl.state.pending.procs) & set(h.leaving)
    assert not [r for r in ctl.state.records if r.outcome is Outcome.REFUSED]


def test_the_sync_interval_grows_with_the_nodes_so_the_controller_takes_a_bounded_rate(tmp_path):
    """Each node syncs every max(0.1 s, nodes / controller.syncs_per_s) with nothing to report;
    one is declared lost after five intervals where that is longer than agent_timeout_s."""
    ctl, node, ranks = controller(tmp_path, syncs_per_s=10, agent_timeout_s=1)
    assert ctl.membership.sync_interval() == 0.1
    for i in range(5):
        ctl.membership.agent_request("register", {"node": f"n{i}", "slots": 1})
    reply = ctl.membership.agent_request("sync", {"node": "n0"})
    assert reply["next_sync_s"] == ctl.membership.sync_interval() == 0.6  # (six nodes, the local one too)
    assert ctl.membership.lost_after() == 3.0
