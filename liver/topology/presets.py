"""Named jobs for the command line: the embedded demo job and GPU-sized reference models."""

from __future__ import annotations

from dataclasses import replace

from liver.topology.config import JobConfig, ModelConfig, TrainConfig

PRESETS: dict[str, JobConfig] = {
    # the default of `liver run` / `make demo`: trains in seconds on a few CPU processes
    "tiny": JobConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_heads=4, ffn_size=128,
                                        vocab_size=256, seq_len=32),
                      train=TrainConfig(global_batch=8, micro_batch=2, warmup_steps=5)),
    # tp up to 8 on CPU (8 heads): dry runs of the 8-GPU scenarios
    "tiny8": JobConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_heads=8, ffn_size=128,
                                         vocab_size=256, seq_len=32),
                       train=TrainConfig(global_batch=8, micro_batch=1, warmup_steps=5)),
    "1b": JobConfig(model=ModelConfig(num_layers=16, hidden_size=2048, num_heads=16, ffn_size=5632,
                                      vocab_size=50257, seq_len=2048, vocab_multiple=128),
                    train=TrainConfig(global_batch=16, micro_batch=4, warmup_steps=2, lr=3e-4, min_lr=3e-5),
                    compute_dtype="bfloat16"),
    "3b": JobConfig(model=ModelConfig(num_layers=28, hidden_size=3072, num_heads=24, ffn_size=8192,
                                      vocab_size=50257, seq_len=2048, vocab_multiple=128),
                    train=TrainConfig(global_batch=16, micro_batch=4, warmup_steps=2, lr=3e-4, min_lr=3e-5),
                    compute_dtype="bfloat16"),
    "7b": JobConfig(model=ModelConfig(num_layers=32, hidden_size=4096, num_heads=32, ffn_size=11008,
                                      vocab_size=32000, seq_len=2048, vocab_multiple=128),
                    train=TrainConfig(global_batch=16, micro_batch=2, warmup_steps=2, lr=3e-4, min_lr=3e-5),
                    compute_dtype="bfloat16"),
}


# the target-choice bench's model shapes (``liver bench target``, and the CPU profile fitted to it)
TARGET_SHAPES = {"tiny": ("tiny", {}), "tiny8-7layers": ("tiny8", {"num_layers": 7})}


def target_shape(shape: str) -> JobConfig:
    name, model = TARGET_SHAPES[shape]
    job = PRESETS[name]
    return replace(job, model=replace(job.model, **model))


def preset(name: str) -> JobConfig:
    if name not in PRESETS:
        raise ValueError(f"model={name!r}: allowed {', '.join(PRESETS)}")
    return PRESETS[name]
