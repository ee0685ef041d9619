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
