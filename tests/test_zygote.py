"""The node agent's zygote: workers forked from one template process, their exit statuses
reported back, and clear errors when the template is gone."""

import os
import signal
import threading

import pytest

from liver.agent.zygote import ForkedWorkers, Zygote
from liver.engine.interface import DEFAULT_ENGINE
from liver.runtime.preload import CPU_PRELOAD, ENTRY


@pytest.fixture
def zygote():
    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    yield z
    z.close()


def test_a_failing_worker_reports_its_exit_status_and_its_traceback(zygote, tmp_path):
    log = tmp_path / "w.log"
    pid = zygote.start(str(tmp_path / "no-such-spec.json"), {"PATH": os.environ.get("PATH", "")}, str(log),
                      quiet=True, idle=False, entry=ENTRY)
    assert pid > 0 and pid != zygote.process.pid
    assert zygote.exit_status(pid, 60) == 1
    assert "no-such-spec.json" in log.read_text()


def test_workers_are_forked_from_one_template_and_exit_statuses_are_not_mixed(zygote, tmp_path):
    pids = [zygote.start(str(tmp_path / f"missing{i}.json"), {}, str(tmp_path / f"w{i}.log"), quiet=True,
                        idle=i == 1, entry=ENTRY) for i in range(3)]
    assert len(set(pids)) == 3
    assert [zygote.exit_status(p, 60) for p in pids] == [1, 1, 1]
    for i in range(3):
        assert f"missing{i}.json" in (tmp_path / f"w{i}.log").read_text()


def test_a_dead_template_is_a_clear_error_not_a_hang(tmp_path):
    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    os.kill(z.process.pid, signal.SIGKILL)
    z.process.wait()
    with pytest.raises(RuntimeError, match="zygote .* ended"):
        z.start(str(tmp_path / "s.json"), {}, str(tmp_path / "w.log"), quiet=True, idle=False, entry=ENTRY)
    z.close()


def test_a_template_closed_twice_leaves_the_descriptor_that_took_its_number_alone(tmp_path):
    """Closed by a starter that shared it and by its owner: the second close is nothing. (It once
    closed whatever had taken the number since: a job store's event loop, whose owner then hung at
    exit waiting for a thread that never woke.) A start after the close is refused in words."""
    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    number = z._req_w
    r, w = os.pipe()
    z.close()
    os.dup2(w, number)  # (another's descriptor now has that number)
    z.close()
    os.write(number, b"x")
    assert os.read(r, 1) == b"x"
    with pytest.raises(RuntimeError, match="was closed: it starts no more workers"):
        z.start(str(tmp_path / "s.json"), {}, str(tmp_path / "w.log"), quiet=True, idle=False, entry=ENTRY)
    for fd in (r, w, number):
        os.close(fd)


def test_closing_ends_the_template(tmp_path):
    """A ready template ends by itself when closed; one still importing (an idle-priority one on a
    busy node can be for long) is not waited for: the agent's shutdown never hangs on it."""
    import time

    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    z.wait_ready()
    z.close()
    assert z.process.returncode == 0
    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    t0 = time.time()
    z.close()
    assert z.process.returncode is not None and time.time() - t0 < 10


def test_the_boot_bench_starts_joiners_both_ways(tmp_path):
    from liver.bench.boot import run
    rows = run(repeats=1, run_dir=tmp_path)
    assert [r["start"] for r in rows] == ["fresh interpreter", "forked from the zygote"]
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 and len(r["samples"]) == 1 for r in rows)


def test_ready_once_the_template_has_imported(zygote):
    zygote.wait_ready()
    assert zygote.process.poll() is None


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE here")
def test_cold_joiners_fork_from_an_idle_priority_template_ranks_from_a_normal_one(tmp_path):
    w = ForkedWorkers(CPU_PRELOAD, ENTRY, (DEFAULT_ENGINE,))
    try:
        w.ranks.wait_ready()
        w.joiners.wait_ready()
        assert os.sched_getscheduler(w.ranks.process.pid) == os.SCHED_OTHER
        assert os.sched_getscheduler(w.joiners.process.pid) == os.SCHED_IDLE  # its forks' page tables too
        rank = w.start(str(tmp_path / "a.json"), {}, str(tmp_path / "a.log"), quiet=True, idle=False)
        joiner = w.start(str(tmp_path / "b.json"), {}, str(tmp_path / "b.log"), quiet=True, idle=True)
        assert w.exit_status(rank, 60) == 1 and w.exit_status(joiner, 60) == 1
        assert "a.json" in (tmp_path / "a.log").read_text() and "b.json" in (tmp_path / "b.log").read_text()
    finally:
        w.close()


def test_a_start_waiting_for_a_template_gives_up_when_the_job_is_interrupted(tmp_path):
    """Ctrl-C while a joiner's template still imports (at idle priority on a busy node, for long):
    the waiting start gives up at once, so the controller's loop can stop the job."""
    import threading
    import time

    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    threading.Timer(0.05, z.interrupt).start()
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        z.start(str(tmp_path / "s.json"), {}, str(tmp_path / "w.log"), quiet=True, idle=False, entry=ENTRY)
    assert time.time() - t0 < 1.5
    z.close()


def test_any_omp_num_threads_starts_the_job_and_workers_take_it_as_torchrun_does(tmp_path, monkeypatch, capsys):
    """OMP_NUM_THREADS=4 once stopped `liver run` (the template's math libraries started a thread
    pool at import, and a fork copies one thread); now the template runs single-threaded and each
    worker sets the user's count after its fork; a value that is no count is refused up front."""
    from liver.cli import main
    from liver.host.threads import check_threads, worker_threads
    assert worker_threads("gloo", {"OMP_NUM_THREADS": "4"}) == 4 and worker_threads("nccl", {}) == 1
    for bad in ("abc", "0", "-2", "1.5"):
        with pytest.raises(ValueError, match="OMP_NUM_THREADS=.*allowed unset or a thread count"):
            check_threads({"OMP_NUM_THREADS": bad})
    none = tmp_path / "none.txt"
    none.write_text("# no events\n")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert main(["run", "--events", str(none), "--steps", "4", "--run-dir", str(tmp_path / "run")]) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    assert main(["run", "--events", str(none), "--steps", "4", "--run-dir", str(tmp_path / "run2")]) == 2
    assert "OMP_NUM_THREADS='abc'" in capsys.readouterr().err and not (tmp_path / "run2" / "logs").exists()


def test_a_recipes_error_in_the_rehearsal_reaches_the_terminal_with_its_type_message_and_line(tmp_path, capsys):
    """The template rehearses a training step of the recipe before it forks anyone: an error of the
    recipe's own there is said with its type, its message and the recipe's line (it was only "the
    zygote ended before it forked")."""
    from pathlib import Path

    from liver.cli import main
    root = Path(__file__).resolve().parent.parent
    recipe = tmp_path / "broken.py"
    recipe.write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('broken_llama', {str(root / 'examples' / 'llama.py')!r})\n"
        "llama = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(llama)\n"
        "class Broken(llama.LlamaRecipe):\n"
        "    def batch(self, job, dp_rank, dp_size, position):\n"
        "        raise RuntimeError('my corpus is not there')\n"
        "RECIPE = Broken()\n")
    none = tmp_path / "none.txt"
    none.write_text("# no events\n")
    rc = main(["run", "--config", str(root / "configs" / "llama-native.toml"), "--set", f"engine={recipe}:RECIPE",
               "--events", str(none), "--steps", "4", "--run-dir", str(tmp_path / "run")])
    out = capsys.readouterr()
    assert rc != 0
    assert f"RuntimeError: my corpus is not there (at {recipe}:7: raise RuntimeError('my corpus is not there'))" \
        in out.err + out.out, out.err[-2000:]


def test_workers_see_their_generations_rank_world_size_and_local_sizes_as_torchrun_sets_them():
    from liver.protocol.messages import GenerationSpec
    from liver.runtime.member import torchrun_env
    from liver.topology import ParallelConfig
    spec = GenerationSpec(generation=3, parallel=ParallelConfig(dp=4), procs=(7, 8, 9, 10),
                          nodes=("a", "a", "b", "b"))
    assert torchrun_env(spec, 2, 0) == {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                                        "GROUP_RANK": "1"}
    one = GenerationSpec(generation=0, parallel=ParallelConfig(dp=2), procs=(0, 1))  # (no node names: one node)
    assert torchrun_env(one, 1, 1)["LOCAL_WORLD_SIZE"] == "2"


@pytest.mark.timeout(300)
def test_a_joiner_that_cannot_be_started_in_time_cancels_its_handoff_and_the_job_trains_on(tmp_path, monkeypatch):
    """The cold joiners' template hangs (stopped, as a loaded 2-core node once starved it): a
    joiner's start times out after agent.start_timeout_s, and its scale-out is cancelled with that
    reason while the job trains on to its last step (it used to end the whole job)."""
    from liver.agent import starters, zygote
    from test_run import liver

    made = []

    def hung_joiners(spec):  # (templates of this job's own, not those kept across the tests' jobs)
        w = zygote.ForkedWorkers(spec["preload"], spec["entry"], tuple(spec["args"]), joiners=spec["joiners"],
                                 start_timeout_s=spec["start_timeout_s"])
        made.append(w)
        if w.joiners is not None:  # stopped once it has imported (a fork then never comes)
            z = w.joiners
            threading.Thread(target=lambda: (z.wait_ready(), os.kill(z.process.pid, signal.SIGSTOP)),
                             daemon=True).start()
        return w

    monkeypatch.setattr(starters, "make", hung_joiners)
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-out 4\n")
    rep = liver(tmp_path / "run", "--events", str(events), "--parallel", "1,1,2", "--gpus", "2", "--steps", "12",
                "--end-after-events", "-1", "--ckpt-every", "0", "--digest", "switch",
                "--set", "agent.start_timeout_s=2")
    assert rep["rc"] == 0
    (ev,) = rep["events"]
    assert ev["status"].startswith("cancelled: joiner process") and "did not fork a worker in 2 s" in ev["status"], ev
    assert rep["steps"][-1]["step"] == 12 and rep["steps"][-1]["parallel"] == "tp1pp1dp2"
    assert made and all(not w.usable() for w in made)  # (the job closed its templates, the stopped one too)


def test_step_lines_carry_their_time_and_are_told_apart_from_a_processs_last_words():
    import logging

    from liver import logs
    from liver.controller.failures import last_line
    rec = logging.LogRecord("liver.steps", logging.INFO, "", 0, "step: 7     loss: 3.1", None, None)
    line = logging.Formatter(logs.STEP_FORMAT).format(rec)
    assert line.startswith("[liver] 2") and line.endswith("step: 7     loss: 3.1") and logs.is_step_line(line)
    assert last_line(f"Traceback ...\nValueError: bad\n{line}\n") == "ValueError: bad"
