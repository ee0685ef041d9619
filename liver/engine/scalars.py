"""The scalars that, with the shards, are an engine's whole training state when it trains on
LiveR's corpus with the job's own schedule (``TrainConfig``): the step, the samples consumed, the
seed, the learning-rate schedule and the corpus. The reference and Megatron-Core engines keep
these; a recipe keeps its own."""

from __future__ import annotations

from typing import Any

from liver.data import tokens_of
from liver.engine.reference.optim import learning_rate
from liver.topology.config import TrainConfig


def of(t: TrainConfig, step: int, consumed_samples: int) -> dict[str, Any]:
    return {"step": step, "consumed_samples": consumed_samples,
            "rng": {"seed": t.seed, "counter": step},
            "lr_schedule": {"lr": t.lr, "min_lr": t.min_lr, "warmup_steps": t.warmup_steps,
                            "total_steps": t.total_steps, "current": learning_rate(t, step)},
            "corpus": tokens_of(t).fingerprint}


def load(t: TrainConfig, s: dict[str, Any]) -> tuple[int, int]:
    """The step and samples consumed of ``s``; ValueError where its seed is not the job's."""
    if s["rng"]["seed"] != t.seed:
        raise ValueError(f"scalars.rng.seed={s['rng']['seed']} differs from the job's train.seed={t.seed}")
    return int(s["step"]), int(s["consumed_samples"])
