"""Configuration: every component's options typed and checked where they are owned, job files
read with tomllib, overrides field by field, and bad input refused before any process starts."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from liver.cli import main
from liver.config import RunConfig
from liver.config.fields import from_dict, to_dict
from liver.config.jobfile import build, load, override
from liver.protocol.worker import WorkerConfig, WorkerSpec

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_job_file_loads_and_checks(path):
    cfg = load(path).with_slots(4)
    assert isinstance(cfg, RunConfig)
    if cfg.events.schedule:
        assert Path(cfg.events.schedule).is_file()  # relative to the file


def test_custom_shape_from_the_file_and_overrides():
    cfg = load(CONFIGS / "custom-shape.toml", [override("job.model.num_layers=6"), override("parallel=2,1,2"),
                                               override("transfer.budget_mib=64")])
    assert cfg.job.model.num_layers == 6 and cfg.job.model.num_heads == 8 and cfg.job.model.seq_len == 48
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp) == (2, 1, 2)
    assert cfg.transfer.budget_bytes == 64 << 20
    assert cfg.job.train.global_batch == 16


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 12), heads=st.sampled_from([1, 2, 4, 8]), head_dim=st.sampled_from([2, 4, 8]),
       ffn=st.integers(1, 64), vocab=st.integers(1, 600), seq=st.integers(1, 64), budget=st.integers(1, 4096),
       share=st.floats(0, 1), every=st.integers(0, 100), mock=st.integers(0, 5),
       connect=st.sampled_from(["auto", "background", "boundary"]))
def test_round_trip_through_plain_data_is_exact(layers, heads, head_dim, ffn, vocab, seq, budget, share, every,
                                                 mock, connect):
    cfg = build({"job": {"model": {"num_layers": layers, "num_heads": heads, "hidden_size": heads * head_dim,
                                   "ffn_size": ffn, "vocab_size": vocab, "seq_len": seq}},
                 "transfer": {"budget_mib": budget}, "prepare": {"companion_share": share, "mock_steps": mock,
                                                                 "connect": connect},
                 "checkpoint": {"every": every}, "parallel": "1,1,1", "gpus": 1})
    assert from_dict(RunConfig, json.loads(json.dumps(to_dict(cfg))), "") == cfg
    worker = WorkerConfig(job=cfg.job, backend=cfg.backend, steps=cfg.steps, connect=cfg.connect, transfer=cfg.transfer,
                          prepare=cfg.prepare, checkpoint=cfg.checkpoint)
    spec = WorkerSpec(proc=3, slot=1, role="joiner", generation=2, store_addr="127.0.0.1:1", run_dir="/r",
                      config=worker, cores=(0, 1))
    assert from_dict(WorkerSpec, json.loads(json.dumps(to_dict(spec))), "worker") == spec


@pytest.mark.parametrize("text, message", [
    ("transfer.budget_mib=0", r"transfer.budget_mib=0: allowed an integer from 1"),
    ("transfer.budget_mib=1.5", r"transfer.budget_mib=1.5: expected an integer"),
    ("checkpoint.every=-1", r"checkpoint.every=-1: allowed 0 \(off\)"),
    ("prepare.connect=soon", r"prepare.connect='soon': allowed 'auto'"),
    ("prepare.companion_share=1.5", r"prepare.companion_share=1.5: allowed a fraction"),
    ("prepare.mock_steps=-1", r"prepare.mock_steps=-1"),
    ("agent.slots=0", r"agent.slots=0: allowed 1"),
    ("controller.mode=fast", r"controller.mode='fast': allowed 'live'"),
    ("controller.end_after_events=-2", r"controller.end_after_events=-2"),
    ("steps=0", r"steps=0: allowed 1"),
    ("gpus=9", r"gpus=9: allowed 1 to agent.slots=4"),
    ("backend=mpi", r"backend='mpi': allowed 'gloo', 'nccl'"),
    ("digest=always", r"digest='always'"),
    ("preset=huge", r"preset='huge': allowed 'tiny'"),
    ("parallel=3,1,1", r"parallel=tp3pp1dp1: tp\*pp\*dp=3 but gpus=2"),
    # (an optional field's message: the field the value failed, said once; was "expected must be ...")
    ("parallel=0,1,1", r"^parallel='0,1,1': parallel.tp=0: must be a positive integer$"),
    ("parallel=a", r"^parallel='a': expected 'tp,pp,dp' \(three integers\)$"),
    ("job.model.num_heads=3", r"num_heads=3 does not divide hidden_size=64"),
    ("job.model.num_layers=many", r"job.model.num_layers='many': expected an integer"),
    ("job.model.depth=3", r"job.model.depth: no such field; allowed: num_layers"),
    ("transfer=3", r"transfer=3: expected a table"),
    ("events.compress=0", r"events.compress=0.0: allowed a positive factor"),
])
def test_bad_fields_are_refused_naming_field_value_and_what_is_allowed(text, message):
    with pytest.raises(ValueError, match=message):
        build({"agent": {"slots": 4}}, override(text))


def test_one_default_per_option():
    """The worker's options come from the same dataclasses as the job's: no second default."""
    cfg = build({})
    worker_fields = {f.name for f in fields(WorkerConfig)}
    for name in ("transfer", "prepare", "checkpoint"):
        assert name in worker_fields
        assert type(getattr(cfg, name))() == getattr(cfg, name)


def test_malformed_job_files_and_overrides_are_refused(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("gpus = [")
    assert main(["run", "--config", str(bad), "--run-dir", str(tmp_path / "r")]) == 2
    assert "bad.toml: not a TOML job file" in capsys.readouterr().err
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00g")
    assert main(["run", "--config", str(binary), "--run-dir", str(tmp_path / "r")]) == 2
    assert "bin.toml: not a TOML job file" in capsys.readouterr().err
    assert main(["run", "--config", str(tmp_path / "none.toml"), "--run-dir", str(tmp_path / "r")]) == 2
    assert "none.toml: no such job file" in capsys.readouterr().err
    assert main(["run", "--set", "steps", "--run-dir", str(tmp_path / "r")]) == 2
    assert "expected section.field=value" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing started, nothing written


@pytest.mark.parametrize("argv, message", [
    (["--budget-mib", "0"], "transfer.budget_mib=0"),
    (["--ckpt-every", "-1"], "checkpoint.every=-1"),
    (["--slots", "0"], "agent.slots=0"),
    (["--gpus", "3", "--parallel", "3,1,1"], "tp=3 does not divide"),
    (["--connect", "later"], "prepare.connect='later'"),
    (["--events", "/nonexistent/events.txt"], "no such events file"),
    (["--set", "timeline=3"], "timeline=3"),
])
def test_cli_refuses_before_any_process_starts(tmp_path, capsys, argv, message):
    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


def test_scale_without_a_running_job_is_a_clear_error(tmp_path, capsys):
    assert main(["scale", "--run-dir", str(tmp_path), "scale-in", "1"]) == 2
    assert "no control.json there" in capsys.readouterr().err
    (tmp_path / "control.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x"}))
    assert main(["scale", "--run-dir", str(tmp_path), "scale-in", "1"]) == 2
    assert "does not answer" in capsys.readouterr().err


def test_this_stages_options_are_refused_naming_the_field_and_what_is_allowed():
    from liver.config.jobfile import build
    for layer, said in [({"checkpoint": {"keep": 0}}, "checkpoint.keep=0: allowed a whole number from 1"),
                        ({"checkpoint": {"escalate_after": "x"}}, "checkpoint.escalate_after='x': expected an integer"),
                        ({"agent": {"start_timeout_s": 0}}, "agent.start_timeout_s=0.0: allowed 0.5 to 3600 s"),
                        ({"controller": {"stop_on_nonfinite_loss": "maybe"}},
                         "controller.stop_on_nonfinite_loss='maybe': expected true or false")]:
        with pytest.raises(ValueError) as e:
            build({"preset": "tiny"}, layer)
        assert said in str(e.value), str(e.value)


def test_the_commands_that_talk_to_a_running_job_import_no_torch(tmp_path):
    """``liver status/scale/queue/stop`` answer in well under a second: no torch behind them."""
    import subprocess
    import sys

    (tmp_path / "control.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x"}))
    code = ("import sys; from liver.cli import main\n"
            f"for argv in (['status'], ['scale', 'scale-in', '1'], ['queue'], ['stop']):\n"
            f"    assert main([*argv[:1], '--run-dir', {str(tmp_path)!r}, *argv[1:]]) == 2, argv\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("does not answer") == 4


def test_without_the_simulators_extra_liver_sim_says_what_to_install(tmp_path):
    """SimPy and matplotlib are extras (``liver[sim]``, ``liver[plot]``): the core trains without them."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['simpy'] = sys.modules['matplotlib'] = None\n"
            "from liver.cli import main\n"
            f"sys.exit(main(['sim', 'project', 'downtime', '--out', {str(tmp_path)!r}]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "pip install 'liver[sim]'" in p.stderr, p.stderr


def test_the_liver_command_ends_with_mains_code_and_its_output_written(tmp_path):
    """``liver`` (``cli.entry``) ends the process as soon as ``main`` returns, without the
    interpreter's teardown: its exit code is main's, and what it printed is all there."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "liver.cli", "run", "--set", "parallel=3,1,1", "--set", "gpus=3",
                        "--run-dir", str(tmp_path / "a")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "parallel.tp=3 does not divide" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "liver.cli", "sim", "project", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "usage: liver sim project" in p.stdout
    code = ("import atexit, sys; atexit.register(print, 'interpreter teardown')\n"  # (skipped: the process ends first)
            "sys.argv = ['liver', 'run', '--set', 'parallel=3,1,1', '--set', 'gpus=3', '--run-dir', "
            f"{str(tmp_path / 'b')!r}]\n"
            "from liver.cli import entry; entry()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "interpreter teardown" not in p.stdout and "does not divide" in p.stderr, p


def test_a_trace_or_a_schedule_given_as_a_flag_replaces_the_job_files_source_of_events(tmp_path, capsys):
    """``--trace`` on a job file that names a schedule (or ``--events`` on one that names a trace):
    the flag's is the job's one source of events; with a trace, the job starts on the trace's
    first count, so a first configuration is checked against that count, not the file's ``gpus``."""
    import argparse

    from liver.controller.commands import job_flags, run_config

    native = str(Path(__file__).resolve().parent.parent / "configs" / "llama-native.toml")  # (a schedule, gpus = 2)
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,n1\n0,add,n2\n0,add,n3\n0,add,n4\n5000,remove,n4\n")
    parser = argparse.ArgumentParser()
    job_flags(parser)
    cfg = run_config(parser.parse_args(["--config", native, "--trace", str(trace), "--parallel", "1,1,4"]))
    assert (cfg.events.schedule, cfg.events.trace) == (None, str(trace.resolve()))
    with_trace = tmp_path / "with-trace.toml"
    with_trace.write_text(f'[events]\ntrace = "{trace}"\n')
    cfg = run_config(parser.parse_args(["--config", str(with_trace), "--events", native.replace(".toml", ".events")]))
    assert cfg.events.trace is None and cfg.events.schedule.endswith("llama-native.events")
    # the trace starts with 4 GPUs: a first configuration of 2 is refused, naming both, before anything starts
    run_dir = tmp_path / "run"
    assert main(["run", "--config", native, "--trace", str(trace), "--run-dir", str(run_dir)]) == 2
    assert "parallel=tp2pp1dp1: tp*pp*dp=2 but the trace starts with 4 GPUs" in capsys.readouterr().err
    assert not run_dir.exists()
