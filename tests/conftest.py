import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from liver.launch import WorkerPool  # noqa: E402
from liver.topology import JobConfig, ModelConfig, TrainConfig  # noqa: E402

TINY = JobConfig(model=ModelConfig(num_layers=4, hidden_size=32, num_heads=4, ffn_size=64,
                                   vocab_size=256, seq_len=16, vocab_multiple=64),
                 train=TrainConfig(global_batch=8, micro_batch=1, warmup_steps=2, lr=3e-3,
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
    """A job's starter whose templates outlive the job (``shared_templates``): closing it leaves
    them for the next job of this test process; one interrupted (Ctrl-C) is closed for real."""

    def __init__(self, workers, forget) -> None:
        self.workers, self._forget = workers, forget

    def start(self, *args, **kw):
        return self.workers.start(*args, **kw)

    def exit_status(self, *args, **kw):
        return self.workers.exit_status(*args, **kw)

    def interrupt(self) -> None:
        self._forget()
        self.workers.interrupt()

    def close(self) -> None:
        if not self.workers.usable():  # (interrupted: closed for real)
            self.workers.close()


@pytest.fixture(scope="session", autouse=True)
def shared_templates():
    """Jobs run in this process (``liver run`` called in-process) fork their workers from templates
    kept across jobs: a template boots an interpreter, imports torch and rehearses a CPU step
    (seconds on the 2-core CI machine), and it does not depend on the job (what a worker does is in
    its spec). A template is kept per starter spec and environment (PYTEST_CURRENT_TEST apart), the
    newest few only; one that ended or was interrupted is made again. What a template does itself is
    tested in test_zygote.py, on templates of its own; jobs whose agents are processes of their own
    (test_nodes.py) make their own, as every job does outside the tests."""
    import collections
    import json

    from liver.agent import starters

    real, kept = starters.make, collections.OrderedDict()

    def make(spec):
        if spec.get("kind") != "forked":
            return real(spec)
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"))
        key = (json.dumps(spec, sort_keys=True), env)
        workers = kept.get(key)
        if workers is None or not workers.usable():
            if workers is not None:
                workers.close()
            workers = kept[key] = real(spec)
            while len(kept) > 6:  # (each template holds an interpreter with torch imported)
                kept.popitem(last=False)[1].close()
        kept.move_to_end(key)
        return _Kept(workers, lambda: kept.pop(key, None))

    starters.make = make
    yield
    starters.make = real
    for workers in kept.values():
        workers.close()
