"""Core binding of CPU workers (liver/agent/cores.py): the slots' cores are disjoint runs of the
node's cores, none where there are fewer cores than slots; in a running job every thread of a
rank runs on its slot's cores, a cold joiner's too once it holds its rank; the companion that
prepared the handoff ran on any of the node's cores."""

import json
import os
import threading

import pytest
from hypothesis import given, strategies as st

from liver.host import cores
from liver.cli import main


@given(st.integers(1, 64), st.lists(st.integers(0, 255), unique=True, max_size=128))
def test_slots_get_disjoint_equal_runs_of_cores_or_none(slots, available):
    got = cores.per_slot(slots, available)
    if len(available) < slots:
        assert got is None
        return
    assert sorted(got) == list(range(slots))
    k = len(available) // slots
    assert all(len(c) == k for c in got.values())
    flat = [c for s in range(slots) for c in got[s]]
    assert flat == available[: k * slots]  # in order, each core once


def test_bad_slot_count_is_refused():
    with pytest.raises(ValueError, match="slots=0"):
        cores.per_slot(0, [0, 1])


def _allowed(pid: int) -> dict[int, list[int]]:
    """Every thread of ``pid`` -> the cores it may run on."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = sorted(os.sched_getaffinity(int(tid)))
        except (ProcessLookupError, FileNotFoundError):
            pass
    return out


@pytest.mark.skipif(len(cores.available()) < 2, reason="needs 2 cores")
@pytest.mark.timeout(300)
def test_ranks_and_a_joiner_run_on_their_slots_cores(tmp_path):
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-out 2 as 1,1,2\n")
    run_dir = tmp_path / "run"
    seen: dict[int, dict[int, list[int]]] = {}
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(rc=main(
        ["run", "--run-dir", str(run_dir), "--digest", "switch", "--events", str(events), "--slots", "2", "--gpus", "1",
         "--steps", "100000", "--end-after-events", "60", "--ckpt-every", "0", "--no-endpoint"])), daemon=True)
    t.start()
    while t.is_alive():  # sample every live worker's threads while it trains after the handoff
        try:
            rows = json.loads((run_dir / "procs.json").read_text())
            steps = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines() if x.strip()]
        except (FileNotFoundError, json.JSONDecodeError):
            rows, steps = [], []
        new = [s for s in steps if s["generation"] >= 1]
        if len(new) > 20:  # some steps after the handoff: the new generation's threads bound too
            for r in rows:
                if r["alive"]:
                    try:
                        seen[r["proc"]] = _allowed(r["pid"])
                    except FileNotFoundError:
                        pass
        if len(seen) == 2:
            break
        t.join(0.05)
    t.join(300)
    assert box["rc"] == 0
    rep = json.loads((run_dir / "report.json").read_text())
    ev = rep["events"][0]
    assert ev["status"] == "done" and ev["digest_equal"] is True
    assert ev["prepare_by_proc"]["0"]["cores"] == len(cores.available())  # the old rank's companion
    rows = {r["proc"]: r for r in json.loads((run_dir / "procs.json").read_text())}
    node, k = cores.available(), len(cores.available()) // 2
    assert rows[0]["cores"] == node[:k]
    assert rows[1]["role"] == "joiner" and rows[1]["cores"] == node[k:2 * k]
    assert sorted(seen) == [0, 1]
    for proc, threads in seen.items():
        assert len(threads) > 1  # training, companion leftovers, gloo's
        assert all(c == rows[proc]["cores"] for c in threads.values()), (proc, threads)


def test_a_nodes_gpus_are_counted_as_its_processes_will_see_them_without_torch(tmp_path):
    from liver.host import gpus

    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "3,,1"}) == 1 and gpus.visible({"CUDA_VISIBLE_DEVICES": ""}) == 0
    for i in range(2):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert gpus.visible({}, proc=str(tmp_path)) == 2
    assert gpus.slots("gloo") == gpus.CPU_SLOTS
