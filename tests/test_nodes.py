"""A job on several nodes, each a separate process tree (in a network namespace of its own on a
bridge where this machine can make them, else on loopback): `liver controller` and one `liver
agent` per node, real workers over gloo. Nodes join (scale-out onto them), one gets a preemption
notice (scale-in of its rank within the deadline), one is SIGKILLed with its whole
tree (agent and workers: recovery), and the job that began on node0 and node1 ends on node2 and
node3. Every switch keeps the state digest; the recovery loses at most the steps since the
checkpoint. `/metrics` is scraped and `liver status` read while it runs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from liver.agent.local import stop_agent
from liver.bench.nodes import LocalJob
from liver.cli import main
from liver.controller.endpoint import request


class Job(LocalJob):
    """The tests' job: long, digests at the handoffs, a checkpoint every 5 steps, agents declared
    lost after 4 s of silence, the preparation unpaced (nodes are the subject here, the pace has
    tests of its own), a preparation's groups given 45 s (not 120): once in about 15 runs, a
    controller killed just after it announced a handoff left the ranks out of the resumed one's
    next preparation for the whole group timeout (its joiner: "processes [0, 1] did not arrive
    within 120 s"). The controller killed at that point on purpose (``announce`` below) found a
    resumed controller giving the withdrawn generation's joiner's process id to a new joiner, and
    then, where that joiner had started, numbering its commands to that node's agent from 1 again,
    so that the new joiner's start was taken for done and never run: the wait (both fixed)."""

    def __init__(self, run_dir: Path, *args: str, env: dict[str, str] | None = None):
        super().__init__(run_dir, ["--gpus", "2", "--steps", "100000", "--end-after-events", "-1", "--digest",
                                   "switch", "--ckpt-every", "5", "--set", "controller.agent_timeout_s=4",
                                   "--set", "prepare.group_timeout_s=45", "--companion-share", "0", *args],
                         controller_env=env)


    def train_on_and_end(self, step: int) -> None:
        """Two more steps after ``step``, then the job ended (``/end``) and every agent stopped,
        each with status 0."""
        self.wait(lambda s: s["step"] >= step + 2, "training after it")
        assert request(self.url, self.token, "POST", "/end", {"after": 1})[0] == 202
        assert self.proc.wait(120) == 0, self.tail()
        for a in self.agents.values():
            assert stop_agent(a, 30) == 0


def ranks(s: dict) -> int:
    p = s["parallel"]
    return p["tp"] * p["pp"] * p["dp"] if p else 0


def holders(s: dict) -> set[str]:
    return {n["node"] for n in s["nodes"] if n["ranks"]}


@pytest.mark.timeout(600)
def test_nodes_join_get_a_notice_and_vanish_and_the_job_moves_across_them(tmp_path):
    """The job's whole life on four nodes: node2 joins and the scale-out onto it begins, and the
    controller is SIGKILLed while it prepares: the workers train on (the store lives in a process of
    its own), the agents keep their workers; `liver controller --resume` finds the job in its
    journal, withdraws the handoff no rank committed (or watches the one that was) and does it
    again, its digest kept, nothing rolled back. Then node3 joins (a second scale-out), node0 gets a
    preemption notice (the scale-in of its rank within the deadline), node1 vanishes with its whole
    tree (a recovery from the checkpoint on node2 and node3)."""
    job = Job(tmp_path / "run")
    try:
        for name in ("node0", "node1"):
            job.agent(name, "--notice-file", str(job.run_dir / f"notice-{name}"))
        s = job.wait(lambda s: s["step"] >= 3, "the first generation")
        assert holders(s) == {"node0", "node1"}
        job.agent("node2")  # registers mid-run: on_join "now" scales out onto it
        job.wait(lambda s: s["phase"] in ("prepare", "ready", "switch"), "the scale-out onto node2 to begin")
        os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait()
        before = steps_done(job.run_dir)
        time.sleep(2.0)
        assert steps_done(job.run_dir) > before  # training goes on without a controller
        job.resume()
        s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 3, "the scale-out onto node2 after the restart")
        assert holders(s) == {"node0", "node1", "node2"}
        job.agent("node3")
        s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 4, "the scale-out onto node3")
        assert holders(s) == {"node0", "node1", "node2", "node3"}

        for name, a in job.agents.items():  # an agent imports no torch (its templates and workers do)
            maps = Path(f"/proc/{a.pid}/maps").read_text()
            assert "python" in maps and "libtorch" not in maps, name
        code, text = scrape(job)  # metrics for operators, mid-run (the resumed controller's)
        assert code == 200
        assert metric(text, "liver_agents") == 4 and metric(text, "liver_generation_info", ranks="4") == 1
        assert metric(text, "liver_events_total", kind="scale-out", outcome="done") == 2
        assert metric(text, "liver_downtime_seconds_count") == 2 and metric(text, "liver_step") >= 3

        (job.run_dir / "notice-node0").write_text("30")  # node0's provider: 30 s to leave
        s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 3 and "node0" not in holders(s),
                     "the scale-in of node0")
        assert next(n for n in s["nodes"] if n["node"] == "node0")["notice"]
        assert main(["status", "--url", job.url, "--token", job.token]) == 0

        os.killpg(job.agents["node1"].pid, signal.SIGKILL)  # node1 vanishes: agent and worker at once
        s = job.wait(lambda s: s["phase"] == "stable" and holders(s) == {"node2", "node3"} and ranks(s) == 2,
                     "the recovery on node2 and node3")
        assert not next(n for n in s["nodes"] if n["node"] == "node1")["up"]
        step = s["step"]
        job.wait(lambda s: s["step"] >= step + 3, "training after the recovery")
        assert request(job.url, job.token, "POST", "/end", {"after": 2})[0] == 202
        assert job.proc.wait(120) == 0, job.tail()
        for name, a in job.agents.items():
            if name != "node1":
                assert stop_agent(a, 30) == 0, (job.run_dir / f"agent-{name}.log").read_text()[-2000:]
    finally:
        job.close()
    rep = json.loads((job.run_dir / "report.json").read_text())
    events = [e for e in rep["events"] if e["outcome"] != "requeued"]
    kinds = [(e["event"]["kind"], e["outcome"]) for e in events]
    assert kinds == [("scale-out", "done"), ("scale-out", "done"), ("scale-in", "done"), ("fail-stop", "recovered")]
    assert len(rep["events"]) - len(events) <= 1  # the handoff the dead controller left, at most
    assert events[0]["new"] == "tp1pp3dp1"
    for e in events[:3]:
        assert e["digest_before"] == e["digest_after"] and e["digest_after"] is not None
    assert events[2]["deadline_met"] is True and events[2]["event"]["node"] == "node0"
    rec = events[3]
    assert "node node1 lost" in rec["event"]["source"]
    # only the steps since the newest whole checkpoint (every 5, written beside training: on a loaded
    # machine it may stand a few intervals back, as the step lines and `liver status` say)
    newest = max(s["checkpoint_step"] for s in rep["steps"]
                 if s["generation"] < rec["generation"] and s["checkpoint_step"] is not None)
    assert rec["restored_step"] % 5 == 0 and rec["restored_step"] >= newest, (rec["restored_step"], newest)
    assert rec["lost_steps"] == rec["failed_at_step"] - rec["restored_step"] >= 0
    steps = [s["step"] for s in rep["steps"]]
    assert steps[-1] > rec["restored_step"] and max(steps) == steps[-1]
    before = [s["step"] for s in rep["steps"] if s["generation"] < rec["generation"]]
    assert before == sorted(set(before))  # no step trained twice before the loss: the controller's death rolled nothing back


@pytest.mark.timeout(300)
def test_a_controller_dead_just_after_announcing_a_handoff_is_resumed_and_the_handoff_done_at_once(tmp_path):
    """The controller dies (SIGKILL, ``LIVER_FAULT=announce:1``) right after it announced the
    scale-out onto node2: its spec and plan published, node2's joiner started, the ranks told to
    prepare, and its journal not written since. Resumed, it withdraws that generation and does the
    scale-out again; the ranks and node2 take part in it at once (not after a group's timeout: the
    withdrawn generation's groups hold nobody, its joiner's process id is not used again), digest
    kept, nothing rolled back."""
    job = Job(tmp_path / "run", env={"LIVER_FAULT": "announce:1"})
    try:
        for name in ("node0", "node1"):
            job.agent(name)
        job.wait(lambda s: s["step"] >= 3 and ranks(s) == 2, "the first generation")
        job.agent("node2")
        assert job.proc.wait(60) == -signal.SIGKILL, job.tail()
        job.resume()
        s = job.wait(lambda s: s["phase"] == "stable" and ranks(s) == 3, "the scale-out after the restart", 40)
        assert holders(s) == {"node0", "node1", "node2"}
        job.train_on_and_end(s["step"])
    finally:
        job.close()
    rep = json.loads((job.run_dir / "report.json").read_text())
    kinds = [(e["event"]["kind"], e["outcome"]) for e in rep["events"]]
    assert kinds == [("scale-out", "done")], kinds  # (the withdrawn handoff was never journaled: no record)
    (done,) = rep["events"]
    assert done["generation"] == 2 and done["digest_before"] == done["digest_after"] is not None
    assert 2 not in done["joiners"], done["joiners"]  # (the withdrawn generation's joiner was process 2)
    steps = [s["step"] for s in rep["steps"]]
    assert steps == sorted(set(steps))  # nothing rolled back


def scrape(job: Job) -> tuple[int, str]:
    import urllib.request

    req = urllib.request.Request(job.url + "/metrics", headers={"Authorization": f"Bearer {job.token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"{name} {labels} not in the metrics:\n{text[:3000]}")


def steps_done(run_dir: Path) -> int:
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    return max((json.loads(x)["step"] for x in lines if x.strip()), default=0)


@pytest.mark.timeout(300)
def test_a_job_on_several_local_nodes_counts_every_nodes_slots(tmp_path):
    """`--slots` is each node's: `--nodes 2 --slots 2 --gpus 4` starts on both nodes' slots."""
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--nodes", "2", "--slots", "2", "--gpus", "4", "--steps", "2",
                 "--events", str(empty), "--end-after-events", "-1", "--ckpt-every", "0", "--digest", "switch",
                 "--set", "timeline=false"]) == 0
    rows = [p for n in ("node0", "node1") for p in json.loads((run_dir / f"procs-{n}.json").read_text())]
    assert sorted(p["node"] for p in rows) == ["node0", "node0", "node1", "node1"]


def test_liver_run_with_several_nodes_on_this_machine(tmp_path):
    """`liver run --nodes 2`: two agents on loopback, each a process tree of its own; the job scales
    out from node0's slot onto node1's, and every agent ends with the job."""
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-out 2\n")
    run_dir = tmp_path / "run"
    rc = main(["run", "--run-dir", str(run_dir), "--nodes", "2", "--slots", "1", "--gpus", "1", "--digest", "switch",
               "--events", str(events), "--end-after-events", "3", "--ckpt-every", "0", "--companion-share", "0",
               "--set", "controller.on_join=never"])
    assert rc == 0
    rep = json.loads((run_dir / "report.json").read_text())
    (ev,) = rep["events"]
    assert ev["status"] == "done" and ev["digest_before"] == ev["digest_after"]
    rows = {p["node"] for n in ("node0", "node1") for p in json.loads((run_dir / f"procs-{n}.json").read_text())}
    assert rows == {"node0", "node1"}  # one process on each node
    assert all(not p["alive"] for n in ("node0", "node1") for p in json.loads((run_dir / f"procs-{n}.json").read_text()))


@pytest.mark.parametrize("args,words", [
    (["agent", "--token", "t"], "--controller HOST:PORT"),
    (["agent", "--controller", "127.0.0.1:9"], "--token (or LIVER_TOKEN)"),
    (["agent", "--controller", "ftp://x:1", "--token", "t"], "controller='ftp://x:1': allowed HOST:PORT"),
    (["agent", "--controller", "127.0.0.1:9", "--token", "t", "--slots", "-2"], "slots=-2: allowed 1 to 4096"),
    (["agent", "--controller", "127.0.0.1:9", "--token", "t", "--notice-sigterm", "0"], "--notice-sigterm=0"),
    # (0 was taken for unset: the agent offered its default slots)
    (["agent", "--controller", "127.0.0.1:9", "--token", "t", "--slots", "0"], "--slots=0: allowed 1 to 4096"),
    (["agent", "--controller", "127.0.0.1:99999", "--token", "t"], "(a port from 1 to 65535)"),
    (["agent", "--controller", "127.0.0.1:9", "--token", "t", "--notice-http", "70000"],
     "--notice-http=70000: allowed a port from 1 to 65535"),
    (["agent", "--controller", "127.0.0.1:9", "--token", "t", "--connect-timeout", "0"], "--connect-timeout=0"),
    (["run", "--nodes", "0"], "--nodes=0: allowed 1 to 64"),
    (["run", "--nodes", "2", "--slots", "2", "--gpus", "5"], "gpus=5: allowed 1 to agent.slots=4"),  # (both nodes')
    (["controller", "--port", "70000"], "controller.port=70000"),
    (["controller", "--on-join", "often"], "controller.on_join='often'"),
])
def test_bad_node_flags_are_refused_naming_the_flag(args, words, capsys, monkeypatch):
    monkeypatch.delenv("LIVER_TOKEN", raising=False)
    monkeypatch.delenv("LIVER_SLOTS", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_an_agents_slots_from_its_environment_are_refused_naming_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("LIVER_SLOTS", "four")
    assert main(["agent", "--controller", "127.0.0.1:9", "--token", "t"]) == 2
    assert "LIVER_SLOTS='four': allowed 1 to 4096" in capsys.readouterr().err


def test_an_agent_with_no_controller_waits_saying_so_then_ends_with_one_line(capsys, monkeypatch):
    monkeypatch.delenv("LIVER_TOKEN", raising=False)
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["agent", "--controller", f"127.0.0.1:{port}", "--token", "t", "--node", "early",
                 "--connect-timeout", "1.5"]) == 1
    out, err = capsys.readouterr()
    assert f"node early: no controller at 127.0.0.1:{port} yet; waiting for it" in out
    assert err.strip().splitlines() == [f"liver: agent: node early: no controller at 127.0.0.1:{port} within 1.5 s "
                                        "(--connect-timeout)"]


@pytest.mark.timeout(300)
def test_an_agent_started_before_its_controller_joins_when_it_appears(tmp_path):
    """As a scheduler starts them, in any order: the agent waits, saying so; the controller comes up
    on the port it was told; the agent joins, the job runs on its slot and the agent ends with it."""
    import socket
    import subprocess
    import sys
    import time

    from liver.agent.local import stop_agent
    for _ in range(20):  # two free ports side by side: the endpoint's and the store's
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                continue
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = run_dir / "agent-early.log"
    with open(log, "wb") as f:
        agent = subprocess.Popen([sys.executable, "-m", "liver.cli", "agent", "--controller", f"127.0.0.1:{port}",
                                  "--token", "tok", "--slots", "1", "--node", "early"],
                                 stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.time() + 60
        while "waiting for it" not in log.read_text():
            assert time.time() < end and agent.poll() is None, log.read_text()
            time.sleep(0.1)
        empty = tmp_path / "none.txt"
        empty.write_text("# no events\n")
        rc = main(["controller", "--run-dir", str(run_dir), "--port", str(port), "--token", "tok", "--gpus", "1",
                   "--steps", "4", "--events", str(empty), "--end-after-events", "-1", "--ckpt-every", "0",
                   "--digest", "switch"])
        assert rc == 0
        assert stop_agent(agent) == 0
    finally:
        if agent.poll() is None:
            stop_agent(agent, 1)
    text = log.read_text()
    assert f"node early: joined the controller at 127.0.0.1:{port}" in text and "Traceback" not in text
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["steps"][-1]["step"] == 4
