"""Fail-stop without rollback: a rank killed without notice while every shard it held has a live
replica on a surviving rank. The survivors stop at the last step they completed, and the next
generation is built from their memory over the network: no checkpoint is read, no step re-runs,
the state right after the heal is bit for bit the one the survivors held, and training goes on.
Where a shard has no surviving copy, the periodic checkpoint stays the fallback. Real processes
over gloo (`liver run`)."""

from __future__ import annotations

import json

import pytest

from hypothesis import assume, given, settings, strategies as st

from liver.policy.heal import healing_step, surviving_view, uncovered
from liver.resource_view.table import Survivors
from liver.engine.reference import ADAPTER
from liver.topology import ParallelConfig
from liver.topology.presets import preset
from test_run import background, check_continuous, steps_of, wait_for


def test_which_losses_can_be_healed():
    job = preset("tiny")
    specs = ADAPTER.state_specs(job)
    dp2 = ADAPTER.layout(job, ParallelConfig(tp=2, dp=2))
    procs = (10, 11, 12, 13)
    assert uncovered(surviving_view(dp2, procs, [13]), specs) is None            # its replica is rank 1
    assert uncovered(surviving_view(dp2, procs, [11, 12]), specs) is None        # one TP rank of each replica
    assert "do not cover" in uncovered(surviving_view(dp2, procs, [11, 13]), specs)  # TP rank 1 gone twice
    pp2 = ADAPTER.layout(job, ParallelConfig(pp=2))
    assert uncovered(surviving_view(pp2, (0, 1), [1]), specs) is not None        # a stage with no replica
    assert uncovered(surviving_view(pp2, (0, 1), [0, 1]), specs) == "no rank survived"
    # a replica's TP peer vanished inside a collective the other replica completed: rank 2 stopped
    # a step behind; the complete replica at step 8 heals, rank 2 receives its shards
    view = surviving_view(dp2, procs, [13])
    assert healing_step(view, specs, {0: 8, 1: 8, 2: 7}) == (8, Survivors(dp2, (0, 1)))
    assert healing_step(view, specs, {0: 8, 1: 7, 2: 7}) == (7, Survivors(dp2, (1, 2)))
    assert healing_step(surviving_view(dp2, procs, [12, 13]), specs, {0: 8, 1: 7}) is None


@settings(max_examples=80, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 3]), data=st.data())
def test_the_heal_takes_the_latest_step_whose_survivors_hold_everything(tp, pp, dp, data):
    job = preset("tiny")
    specs = ADAPTER.state_specs(job)
    try:
        layout = ADAPTER.layout(job, ParallelConfig(tp=tp, pp=pp, dp=dp))
    except ValueError:  # the model does not split so
        assume(False)
    n = layout.size
    procs = tuple(range(100, 100 + n))
    dead = data.draw(st.sets(st.sampled_from(procs), max_size=n - 1))
    view = surviving_view(layout, procs, dead)
    steps = {r: data.draw(st.sampled_from([5, 6])) for r in view.ranks}
    got = healing_step(view, specs, steps)
    covering = [s for s in (6, 5) if uncovered(Survivors(layout, tuple(r for r in view.ranks if steps[r] == s)),
                                               specs) is None and s in steps.values()]
    if not covering:
        assert got is None
    else:
        step, at = got
        assert step == covering[0] and all(steps[r] == step for r in at.ranks)
        assert set(at.ranks) == {r for r in view.ranks if steps[r] == step}
    if len(set(steps.values())) == 1:  # one step: the heal is possible exactly where the survivors cover
        assert (got is None) == (uncovered(view, specs) is not None)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 3]), dp=st.sampled_from([1, 2, 4]), data=st.data())
def test_the_survivors_kept_where_no_configuration_uses_them_all_still_hold_the_state(tp, pp, dp, data):
    """``heal.keep``: ``count`` of the survivors, the givers among them holding every shard; it
    finds such a set whenever one exists (here: one holder of each stage's TP slice, tp * pp)."""
    from liver.policy.heal import keep
    job = preset("tiny")
    specs = ADAPTER.state_specs(job)
    try:
        layout = ADAPTER.layout(job, ParallelConfig(tp=tp, pp=pp, dp=dp))
    except ValueError:
        assume(False)
    procs = tuple(range(100, 100 + layout.size))
    dead = data.draw(st.sets(st.sampled_from(procs), max_size=dp - 1))  # (each shard has dp holders: one left)
    view = surviving_view(layout, procs, dead)
    survivors = [procs[r] for r in view.ranks]
    count = data.draw(st.integers(1, len(survivors)))
    got = keep(view, specs, survivors, procs, count)
    if count < tp * pp:
        assert got is None
        return
    kept, held = got
    assert len(kept) == count and set(kept) <= set(survivors) and uncovered(held, specs) is None
    assert {procs[r] for r in held.ranks} <= set(kept)


@pytest.mark.timeout(600)
def test_survivors_a_step_behind_receive_from_the_replica_that_completed_it(tmp_path, monkeypatch):
    """tp2 x dp2, rank 3 killed (-9) after the gradients' data-parallel reduction of step 9: replica
    0 (ranks 0, 1) completes step 9, rank 2 stops at step 8 in its tensor-parallel reduction with
    the lost rank (the timing at which a kill from outside once sent the job back to its
    checkpoint). The heal takes step 9 from replica 0, re-laid out over the 3 survivors; rank 2
    gives nothing and receives its shards; no step is lost, the healed state is the one replica 0
    held, and the steps after equal a restart's. (A replica killed mid-step, the one left holding
    all: test_a_step_re_run_after_a_heal_is_the_step_a_restart_computes.)"""
    from liver.host import faults
    from test_run import liver, replays_as_restart
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    monkeypatch.setenv(faults.ENV, "reduced:3:9")
    rep = liver(tmp_path / "run", "--events", str(empty), "--parallel", "2,1,2", "--gpus", "4", "--steps", "13",
                "--end-after-events", "-1", "--ckpt-every", "0")
    monkeypatch.delenv(faults.ENV)
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "healed from the surviving replicas" and rec["restored_step"] == 9, rec
    assert rec["stopped_behind"] == [2] and rec["new"] == "tp1pp3dp1" and rec["lost_steps"] == 0
    assert rec["checkpoint"] is None and rec["digest_equal"] is True and rec["digest_before"] == rec["digest_after"]
    check_continuous(rep, 13)
    assert len(rep["steps"]) == 13  # no step ran twice
    replays_as_restart(tmp_path, rep, rec, "2,1,2", 4, k=3)


@pytest.mark.timeout(600)
def test_a_corrupt_newest_checkpoint_is_passed_over_for_the_one_before(tmp_path):
    """No replica (two pipeline stages): the checkpoint is the way back; its newest one was damaged
    on disk (a byte flipped) after it was published, so its checksum no longer matches and the
    recovery reads the one before it, exactly."""
    run_dir = tmp_path / "run"
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    t, box = background(run_dir, "--events", str(empty), "--parallel", "1,2,1", "--steps", "70",
                        "--end-after-events", "-1", "--ckpt-every", "20")  # (the next one is 20 steps off)
    latest = run_dir / "ckpt" / "latest.json"

    def two_published():
        try:
            rec = json.loads(latest.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return rec if rec["step"] >= 40 and rec.get("previous") else None

    newest = wait_for(two_published, what="two checkpoints")
    data = sorted(p for p in (run_dir / "ckpt").glob(f"step{newest['step']:08d}/*.distcp"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    import os
    import signal
    from test_run import procs
    os.kill(next(p for p in procs(run_dir) if p["proc"] == 1)["pid"], signal.SIGKILL)
    t.join(timeout=500)
    rep = box["report"]
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "recovered"
    assert rec["restored_step"] < newest["step"] and rec["checkpoint"] != newest["path"]
    at = [s for s in rep["steps"] if s["step"] == rec["restored_step"] and s["generation"] == 0]
    assert at[-1]["digest"] == rec["digest_after"]  # the one before, whole


@pytest.mark.timeout(600)
def test_a_rank_that_hangs_is_detected_by_its_heartbeat_then_healed(tmp_path):
    """SIGSTOP instead of a kill: its peers block in a collective with it and nothing fails by
    itself; its heartbeat stops, the controller kills it after ``hang_timeout_s``, and the survivor
    heals as after any fail-stop."""
    import os
    import signal
    from test_run import procs
    run_dir = tmp_path / "run"
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    t, box = background(run_dir, "--events", str(empty), "--parallel", "1,1,2", "--steps", "40",
                        "--end-after-events", "-1", "--ckpt-every", "5", "--set", "controller.hang_timeout_s=2")
    wait_for(lambda: any(s["step"] >= 8 for s in steps_of(run_dir)), what="step 8")
    os.kill(next(p for p in procs(run_dir) if p["proc"] == 1)["pid"], signal.SIGSTOP)
    t.join(timeout=500)
    rep = box["report"]
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "healed from the surviving replicas" and rec["lost_steps"] == 0, rec
    assert "-9" in rec["event"]["source"]  # killed by the controller once its heartbeat stopped
    check_continuous(rep, 40)


@pytest.mark.timeout(600)
def test_a_step_re_run_after_a_heal_is_the_step_a_restart_computes(tmp_path, monkeypatch):
    """A rank lost mid-step (its backward done, its peer's too: the peer holds the gradients of an
    attempt that can never complete): the survivor heals and runs the step again from no gradient,
    so the steps after the heal equal, bit for bit (loss, gradient norm, digest), those of a
    restart that changed to the same layout at the same step through a checkpoint."""
    from liver.host import faults
    from test_run import liver, replays_as_restart
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    monkeypatch.setenv(faults.ENV, "mid-step:1:9")
    rep = liver(tmp_path / "run", "--events", str(empty), "--parallel", "1,1,2", "--gpus", "2", "--steps", "14",
                "--end-after-events", "-1", "--ckpt-every", "0")
    monkeypatch.delenv(faults.ENV)
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "healed from the surviving replicas" and rec["restored_step"] == 8, rec
    assert rec["digest_equal"] is True
    check_continuous(rep, 14)
    replays_as_restart(tmp_path, rep, rec, "1,1,2", 2, k=4, mode="restart")  # (fresh interpreters, as torchrun)


@pytest.mark.timeout(600)
def test_survivors_no_configuration_uses_all_of_heal_onto_the_most_that_hold_the_state(tmp_path, monkeypatch):
    """Six processes (tp1pp3dp2 of a 4-layer model, batch 8) lose one mid-step: five survive, and
    no configuration of five GPUs exists (no degree of 5 divides the layers or the batch). Before,
    the heal gave up on that and the checkpoint's recovery stopped the controller with the same
    ValueError. Now the survivors heal onto four of them (the most GPUs a configuration uses whose
    survivors still hold every shard: the cost model's choice, two, could not hold three stages),
    the fifth stops, no step is lost, and the steps after equal a restart's to the same layout."""
    from liver.host import faults
    from test_run import liver, replays_as_restart
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    monkeypatch.setenv(faults.ENV, "mid-step:5:9")
    rep = liver(tmp_path / "run", "--events", str(empty), "--parallel", "1,3,2", "--gpus", "6", "--steps", "11",
                "--end-after-events", "-1", "--ckpt-every", "0", "--set", "agent.slots=6")
    monkeypatch.delenv(faults.ENV)
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "healed from the surviving replicas" and rec["restored_step"] == 8, rec
    assert rec["new"] == "tp1pp1dp4" and len(rec["left_out"]) == 1 and rec["digest_equal"] is True, rec
    check_continuous(rep, 11)
    replays_as_restart(tmp_path, rep, rec, "1,3,2", 6, k=2, extra=("--set", "agent.slots=6"), mode="restart")


@pytest.mark.timeout(600)
def test_a_rank_lost_within_a_pipeline_stages_tp_collective_is_healed_not_crashed_on(tmp_path, monkeypatch):
    """The replicated recipe on tp2pp2dp2: a rank killed mid-step breaks its peers' TP all-reduces
    inside their stages' forward, whose errors torch's pipelining wraps ("[Stage 1] failed to run
    forward", the collective's error its cause). The survivors took that for a bug of the model and
    exited: no heal, a rollback to the checkpoint (4 steps lost here). Now they stall on it
    (``world.broken.broken_group`` follows the cause) and heal from their replicas, nothing lost."""
    from pathlib import Path

    from liver.host import faults
    from test_run import liver, replays_as_restart
    root = Path(__file__).resolve().parent.parent
    config = ("--config", str(root / "configs" / "llama-native.toml"),
              "--set", f"engine={root / 'tests' / 'recipes' / 'replicated.py'}:RECIPE", "--set", "agent.slots=8")
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    monkeypatch.setenv(faults.ENV, "mid-step:7:5")
    rep = liver(tmp_path / "run", *config, "--events", str(empty), "--set", "parallel=2,2,2", "--set", "gpus=8",
                "--steps", "7", "--end-after-events", "-1", "--ckpt-every", "0", "--digest")
    monkeypatch.delenv(faults.ENV)
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["event"]["source"] == "process [7] exited [-9]", rec  # (its peers stalled: none exited 1)
    assert rec["status"] == "healed from the surviving replicas" and rec["lost_steps"] == 0, rec
    assert rec["digest_equal"] is True and rec["restored_step"] == 4
    check_continuous(rep, 7)
    replays_as_restart(tmp_path, rep, rec, "2,2,2", 8, k=2, extra=config)


def test_a_collectives_error_wrapped_by_the_code_that_ran_it_is_still_a_broken_group():
    """``broken_group`` follows an error's cause and context: torch's pipelining, or a user's loop,
    raising its own error from a collective that failed on a lost peer."""
    from liver.world.broken import broken_group

    def raised(outer, inner, how):
        try:
            try:
                raise inner
            except RuntimeError as e:
                if how == "from":
                    raise outer from e
                raise outer
        except RuntimeError as e:
            return e

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:53457")
    for how in ("from", "during"):
        assert broken_group(raised(RuntimeError("[Stage 1] failed to run forward"), gloo, how))
        assert not broken_group(raised(RuntimeError("[Stage 1] failed to run forward"), RuntimeError("shape mismatch"), how))
    assert not broken_group(RuntimeError("CUDA out of memory"))


@pytest.mark.timeout(600)
def test_a_users_replicated_model_heals_mid_step_and_re_runs_the_step_a_restart_computes(tmp_path, monkeypatch):
    """A user's own loop (tests/recipes/replicated.py: examples/llama.py's model whole on each data-
    parallel rank, gradients averaged in the loop, DDP's way): a rank lost mid-step leaves its peer
    with the gradients of an iteration that cannot complete; the peer heals from its own replica,
    ``with step:`` runs the iteration again from no gradient, and the steps after equal a restart's."""
    from pathlib import Path

    from liver.host import faults
    from test_run import liver, replays_as_restart
    root = Path(__file__).resolve().parent.parent
    config = ("--config", str(root / "configs" / "llama-native.toml"),
              "--set", f"engine={root / 'tests' / 'recipes' / 'replicated.py'}:RECIPE")
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    monkeypatch.setenv(faults.ENV, "mid-step:1:9")
    rep = liver(tmp_path / "run", *config, "--events", str(empty), "--set", "parallel=1,1,2", "--steps", "14",
                "--end-after-events", "-1", "--ckpt-every", "0", "--digest")
    monkeypatch.delenv(faults.ENV)
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    assert rec["status"] == "healed from the surviving replicas" and rec["lost_steps"] == 0, rec
    assert rec["digest_equal"] is True and rec["restored_step"] == 8  # (step 9 was the one in flight)
    check_continuous(rep, 14)
    replays_as_restart(tmp_path, rep, rec, "1,1,2", 2, k=3, extra=config)
