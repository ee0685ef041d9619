"""The benchmarks' own plumbing: the README's figures match bench/results, and the GPU scenario
script runs end to end as a CPU dry run (gloo), live and restart, with its JSON."""

import argparse
import json
from pathlib import Path

import pytest

from liver.bench import handoffs, measured
from liver.cli import main


def test_the_readmes_measured_section_is_rendered_from_bench_results():
    assert measured.run(write=False), "README.md is out of date: run `liver bench measured --write`"


EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "llama.py") + ":RECIPE"


@pytest.mark.timeout(600)
def test_the_gpu_scenario_script_dry_runs_on_cpu(tmp_path):
    """Its live half (the restart half is ``liver run --mode restart``, run with fresh interpreters
    in tests/test_heal.py and against live runs in tests/test_run.py; the script's rows from both:
    bench/results/cpu-x2-native-dryrun, cpu-x8-dryrun and the GPU runs)."""
    args = argparse.Namespace(scenario="x2", model="tiny", engine=None, backend="gloo", connect="auto", budget_mib=64,
                              cycles=1, gap=12, live_only=True, run_root=None, out=str(tmp_path),
                              set=["prepare.companion_share=0"])  # (unpaced: the pace has tests of its own)
    result = handoffs.run(args)
    assert json.loads((tmp_path / "handoffs.json").read_text()) == json.loads(json.dumps(result))
    assert [e["event"] for e in result["events"]] == ["scale-out", "reshape", "scale-in"]
    for e in result["events"]:
        assert e["status"] == "done" and e["digest_equal"], e
        assert e["downtime_s"] > 0 and e["prepare_s"] > 0
        sim = e["simulated"]  # the simulator's figures beside it (issue 35 item 4), the CPU profile's on gloo
        assert sim["profile"] == "cpu" and sim["downtime_live_s"] > 0 and sim["prepare_s"] > 0, sim
        assert sim["downtime_restart_s"] > sim["downtime_live_s"]
    assert result["live_only"] is True and result["digests_equal"] is True and result["companion_share"] == 0
    assert (tmp_path / "timeline-live.png").exists() and (tmp_path / "report-live.json").exists()


def test_the_gpu_scenario_script_runs_a_users_model_at_a_presets_shape():
    """Its jobs take the engine and the --set fields (its dry run on CPU, 4 events live and by
    restart: bench/results/cpu-x2-native-dryrun; the same events' paths: test_native.py)."""
    from liver.config.jobfile import build
    args = argparse.Namespace(model="1b", engine=EXAMPLE, set=["job.model.vocab_size=50304"])
    base, sets = handoffs.job_layers(args)
    cfg = build(base, *sets)
    assert cfg.engine.endswith("examples/llama.py:RECIPE") and cfg.job.model.vocab_size == 50304
    assert cfg.job.model.hidden_size == 2048 and type(cfg.adapter).__name__ == "NativeAdapter"
    assert [a for a, _ in handoffs.SCENARIOS["x2-native"](1, 1).events] == [
        "scale-out 2 as 2,1,1", "reshape 1,1,2", "reshape 2,1,1", "scale-in 1 deadline 60s as 1,1,1"]


def test_bench_refuses_bad_flags(capsys):
    assert main(["bench", "handoffs", "--scenario", "x3", "--out", "/tmp/never"]) == 2
    assert "--scenario='x3': allowed x2" in capsys.readouterr().err
    assert main(["bench", "handoffs", "--engine", "nowhere.py:X", "--out", "/tmp/never"]) == 2
    assert "engine='" in capsys.readouterr().err
    assert main(["bench", "handoffs", "--set", "job.model.vocab_size=abc", "--out", "/tmp/never"]) == 2
    assert "job.model.vocab_size='abc': expected an integer" in capsys.readouterr().err
    assert main(["bench", "nodes", "--set", "job.modl.x=1", "--backend", "gloo", "--out", "/tmp/never"]) == 2
    assert "job.modl: no such field" in capsys.readouterr().err


def test_bench_dcp_times_a_step_and_a_save_and_load_of_the_whole_state(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bench", "dcp", "--model", "tiny", "--dir", str(tmp_path), "--repeats", "2", "--steps", "2",
                 "--set", "job.model.hidden_size=128", "--copy-mib", "64", "--out", str(out)]) == 0
    result = json.loads((out / "dcp.json").read_text())
    (row,) = result["rows"]
    assert row["state_bytes"] == 12 * row["params"] and row["step_s"] > 0  # fp32 parameters and AdamW moments
    assert row["job"]["model"]["hidden_size"] == 128 and result["local_copy_GBps"] > 0  # a shape beyond the preset
    d = row["dirs"][str(tmp_path)]
    assert len(d["save_s"]) == len(d["load_s"]) == 2 and d["save_GBps"] > 0 and d["load_GBps"] > 0
    assert list(tmp_path.glob("liver-bench-dcp-*")) == []  # nothing left behind
    assert main(["bench", "dcp", "--dir", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "--dir=" in capsys.readouterr().err
    assert main(["bench", "dcp", "--model", "tiny", "--set", "job.model.hidden=1", "--out", str(tmp_path / "o2")]) == 2
    assert "job.model.hidden: no such field" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    assert main(["bench", "dcp", "--copy-mib", "8", "--out", str(tmp_path / "o3")]) == 2
    assert "--copy-mib=8: allowed 16 to 65536" in capsys.readouterr().err and not (tmp_path / "o3").exists()


def test_bench_build_times_the_construction_a_switch_does_for_both_engines(capsys):
    from liver.bench.build import WAYS, run
    rows = run(EXAMPLE, "tiny", ["1,1,2", "2,1,1"], repeats=2)
    assert [r["parallel"] for r in rows] == ["tp1pp1dp2", "tp2pp1dp1"]
    assert all(r["native_s"] > 0 and r["reference_s"] > 0 and r["ratio"] > 0 for r in rows)
    assert all(r["native_prebuild_s"] > 0 and r["native_at_switch_prebuild_s"] == 0 for r in rows)
    assert all(isinstance(r[f"{w}_first_extra_s"], float) for r in rows for w in WAYS) and rows[0]["with_first_step_ratio"] > 0
    assert [r["native_ahead"] for r in rows] == ["optimizer step and FSDP2's initialisation and its unsharded parameters",
                                              "forward and backward and optimizer step"]
    assert main(["bench", "build", "--model", "tiny", "--parallel", "3,1,1"]) == 2
    assert "parallel.tp=3" in capsys.readouterr().err


def test_bench_host_start_times_processes_started_together_against_one_alone(tmp_path, capsys):
    """``liver bench host-start`` on CPU: each count's slowest process, its phases in order, the
    shards read from the disk of ``--run-dir``; the ratio to one process alone beside them."""
    out = tmp_path / "hs.json"
    assert main(["bench", "host-start", "--procs", "1,2", "--read-mib", "2", "--repeats", "1",
                 "--run-dir", str(tmp_path), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["read_mib_per_process"] == 2
    assert [r["procs"] for r in res["rows"]] == [1, 2] and len(res["runs"]["2"]) == 1
    for r in res["rows"]:
        assert min(r[p] for p in ("import_s", "cuda_s", "read_s", "to_device_s")) >= 0
        assert r["total_s"] >= r["import_s"] > 0 and r["ratio_to_1"]["total_s"] > 0
    assert list(tmp_path.iterdir()) == [out]  # (its shards were removed)
    assert main(["bench", "host-start", "--procs", "0"]) == 2 and "--procs=[0]" in capsys.readouterr().err
    assert main(["bench", "host-start", "--procs", "1,x"]) == 2 and "--procs='1,x'" in capsys.readouterr().err
    assert main(["bench", "host-start", "--run-dir", str(tmp_path / "none")]) == 2
    assert "--run-dir=" in capsys.readouterr().err


def test_bench_rendezvous_times_ranks_meeting_through_one_store(tmp_path, capsys):
    """``liver bench rendezvous``: each count's wall time, interleaved runs, the time per rank
    over the counts; a bad count is refused naming the flag."""
    out = tmp_path / "rv.json"
    assert main(["bench", "rendezvous", "--ranks", "2,6", "--procs", "2", "--repeats", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["ranks"] for r in res["rows"]] == [2, 6] and all(len(v) == 2 for v in res["runs"].values())
    assert all(0 < r["wall_s"] < 60 for r in res["rows"]) and res["s_per_rank"] is not None
    assert main(["bench", "rendezvous", "--ranks", "0"]) == 2 and "--ranks=[0]" in capsys.readouterr().err
    assert main(["bench", "rendezvous", "--ranks", "a"]) == 2 and "--ranks='a'" in capsys.readouterr().err


def test_bench_control_plane_measures_waits_commands_and_a_lost_node(tmp_path, capsys):
    """``liver bench control-plane``: a stage of simulated nodes on standing waits beside a real
    job whose second node is scaled on and off: its waits counted, each command to a real node
    timed from queued to taken, the silent node declared lost; bad counts refused, naming them."""
    assert main(["bench", "control-plane", "--nodes", "6001", "--out", str(tmp_path / "x")]) == 2
    assert "--nodes='6001' (each 0 to 5000)" in capsys.readouterr().err
    assert main(["bench", "control-plane", "--nodes", "3", "--agent-timeout-s", "0.5", "--out", str(tmp_path / "x")]) == 2
    assert "--agent-timeout-s=0.5 (1 to 3600)" in capsys.readouterr().err
    out = tmp_path / "cp"
    assert main(["bench", "control-plane", "--nodes", "3", "--seconds", "5", "--procs", "1",
                 "--agent-timeout-s", "2", "--out", str(out)]) == 0
    (row,) = json.loads((out / "control_plane.json").read_text())["rows"]
    assert row["waits_per_s"] > 3 and not row["errors"]
    assert row["command_delivery_s"] and all(0 <= d < 5 for d in row["command_delivery_s"])
    assert row["lost_detected_s"] is not None and row["lost_detected_s"] >= row["lost_after_s"] - 0.5
