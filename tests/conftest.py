import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from liver.launch import WorkerPool  # noqa: E402
from liver.topology import JobConfig, ModelConfig, TrainConfig  # noqa: E402

TINY = JobConfig(model=ModelConfig(num_layers=4, hidden_size=32, num_heads=4, ffn_size=64,
                                   vocab_size=256, seq_len=16, vocab_multiple=64),
                 train=TrainConfig(global_batch=8, micro_batch=2, warmup_steps=2, lr=3e-3,
                                   corpus_bytes=1 << 20))


@pytest.fixture(scope="session")
def pool():
    """Eight long-lived worker processes shared by the distributed tests."""
    with WorkerPool(8) as p:
        yield p


@pytest.fixture
def tiny_job():
    return TINY


class _Kept:
    """A template that outlives the job that asked for it (``shared_templates``): closing it leaves
    it for the next job of this test process; one interrupted (Ctrl-C) is closed for real."""

    def __init__(self, zygote, forget) -> None:
        self.zygote, self._forget = zygote, forget

    def start(self, *args, **kw):
        return self.zygote.start(*args, **kw)

    def exit_status(self, *args, **kw):
        return self.zygote.exit_status(*args, **kw)

    def usable(self) -> bool:
        return self.zygote.usable()

    def interrupt(self) -> None:
        self._forget()
        self.zygote.interrupt()

    def close(self, wait: bool = True) -> None:
        if not self.zygote.usable():  # (interrupted: closed for real)
            self.zygote.close(wait)

    def wait_closed(self) -> None:
        if not self.zygote.usable():
            self.zygote.wait_closed()


#: the test files whose jobs run in this process (``liver run`` called in-process)
JOB_FILES = ("test_bench.py", "test_checkpoint.py", "test_cores.py", "test_faults.py", "test_heal.py",
             "test_native.py", "test_run.py", "test_suspend.py", "test_zygote.py")
_RUNS_JOBS = False


def pytest_collection_modifyitems(session, config, items):
    global _RUNS_JOBS
    _RUNS_JOBS = any(item.path.name in JOB_FILES for item in items)


#: variables this process sets itself as the tests run (pytest's; torch's inductor, at its import):
#: no template depends on them
IN_PROCESS_ENV = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")


@pytest.fixture(scope="session", autouse=True)
def shared_templates():
    """Jobs run in this process (``liver run`` called in-process) fork their workers from templates
    kept across jobs: a template boots an interpreter, imports torch and rehearses a CPU step
    (seconds on the 2-core CI machine), and it does not depend on the job (what a worker does is in
    its spec). A template is kept per preload, its arguments, its priority and the environment
    (``IN_PROCESS_ENV`` apart), the newest few only: a live job's ranks and a restart job's of
    one engine fork from one template. One that ended or was interrupted is made again. What a
    template does itself is tested in test_zygote.py, on templates of its own; jobs whose agents
    are processes of their own (test_nodes.py) make their own, as every job does outside the tests."""
    import collections
    from pathlib import Path

    from liver.agent import starters
    from liver.agent.zygote import ForkedWorkers, Zygote
    from liver.controller.mode import forked_workers

    real, kept, pinned = starters.make, collections.OrderedDict(), set()

    def template(spec, idle: bool, pin: bool = False):
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in IN_PROCESS_ENV))
        key = (spec["preload"], tuple(spec["args"]), idle, float(spec.get("start_timeout_s", 120.0)), env)
        z = kept.get(key)
        if z is None or not z.usable():
            if z is not None:
                z.close()
            z = kept[key] = Zygote(spec["preload"], tuple(spec["args"]), idle=idle,
                                   start_timeout_s=float(spec.get("start_timeout_s", 120.0)))
            if pin:
                pinned.add(key)
            while len(kept) - len(pinned) > 8:  # (each template holds an interpreter with torch imported)
                oldest = next(k for k in kept if k not in pinned)
                kept.pop(oldest).close()
        kept.move_to_end(key)
        return _Kept(z, lambda: kept.pop(key, None))

    def make(spec):
        if spec.get("kind") != "forked":
            return real(spec)
        return ForkedWorkers.of(spec["entry"], template(spec, idle=False),
                                template(spec, idle=True) if spec["joiners"] else None)

    # made ahead, before the first test: the two engines most jobs of the tests run, a live job's
    # ranks and its cold joiners (an idle-priority template boots slowly once ranks train beside
    # it, seconds of a scale-out's Prepare; made here on idle cores, it is ready when one needs it)
    # (only where the session runs jobs in this process: a file of in-process logic alone pays nothing)
    root = Path(__file__).resolve().parent.parent
    ahead = [template(forked_workers("gloo", engine, joiners=True), idle=idle, pin=True)
             for engine in ("liver.engine.reference:ADAPTER", f"{root}/examples/llama.py:RECIPE") for idle in (False, True)
             if _RUNS_JOBS]
    for t in ahead:
        t.zygote.wait_ready()
    starters.make = make
    yield
    starters.make = real
    for z in kept.values():
        z.close()
