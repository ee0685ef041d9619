"""Model presets for the simulator, 1B to 175B (Llama-style shapes; GPT-3 175B's) trained as a
cluster pretrains them (sequences of 4,096 tokens, a global batch of 1,024: "7b-cluster"; the
names differ from ``liver run``'s GPU presets, "7b", a smaller batch of shorter sequences), and the bytes
of their training state: bf16 parameters and gradients' compute copies aside, what moves at a
reshape is the state of mixed-precision AdamW: bf16 parameters, fp32 master weights and two fp32
moments (14 bytes per parameter)."""

from __future__ import annotations

from liver.topology import JobConfig, ModelConfig, TrainConfig

STATE_BYTES_PER_PARAM = 14
SEQ = 4096


def _job(layers: int, hidden: int, heads: int, ffn: int, vocab: int = 128256, batch: int = 1024) -> JobConfig:
    return JobConfig(model=ModelConfig(num_layers=layers, hidden_size=hidden, num_heads=heads, ffn_size=ffn,
                                       vocab_size=vocab, seq_len=SEQ, vocab_multiple=128),
                     train=TrainConfig(global_batch=batch, micro_batch=1), compute_dtype="bfloat16")


SIM_MODELS: dict[str, JobConfig] = {
    "1b-cluster": _job(16, 2048, 16, 5632, vocab=32000),
    "3b-cluster": _job(28, 3072, 24, 8192, vocab=32000),
    "7b-cluster": _job(32, 4096, 32, 11008, vocab=32000),
    "14b-cluster": _job(40, 5120, 40, 13824, vocab=32000),
    "30b-cluster": _job(60, 6656, 52, 17920, vocab=32000),
    "70b-cluster": _job(80, 8192, 64, 24576, vocab=32000),
    "175b-cluster": _job(96, 12288, 96, 32768, vocab=50257, batch=1536),
}


def sim_model(name: str) -> JobConfig:
    if name not in SIM_MODELS:
        raise ValueError(f"model={name!r}: allowed {', '.join(SIM_MODELS)}")
    return SIM_MODELS[name]


def state_bytes(job: JobConfig) -> int:
    return job.model.facts().params * STATE_BYTES_PER_PARAM
