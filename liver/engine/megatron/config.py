"""A Megatron-Core GPT model's configuration, as the job file's ``[job.model]`` gives it: the
fields a Megatron user sets on the command line (``--num-layers``, ``--hidden-size``, ...), checked
with the field named; ``transformer_config`` makes Megatron's own ``TransformerConfig`` of it for
one layout. What LiveR's engine supports: a dense GPT (local layer spec: no Transformer Engine),
RMSNorm, RoPE, SwiGLU or GELU, grouped-query attention, untied output layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from liver.topology import ParallelConfig


def _positive(name: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"model.{name}={v!r}: allowed a positive integer")


@dataclass(frozen=True)
class GPTConfig:
    num_layers: int = 4
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int | None = None  # grouped-query attention (None: one group a head)
    ffn_hidden_size: int = 128
    vocab_size: int = 256
    seq_length: int = 32
    swiglu: bool = True
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0     # (Megatron's default is 0.1; LLM pre-training runs without)
    attention_dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                     "seq_length"):
            _positive(name, getattr(self, name))
        if self.num_query_groups is not None:
            _positive("num_query_groups", self.num_query_groups)
            if self.num_attention_heads % self.num_query_groups:
                raise ValueError(f"model.num_query_groups={self.num_query_groups}: allowed a divisor of "
                                 f"num_attention_heads={self.num_attention_heads}")
        for name in ("hidden_dropout", "attention_dropout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ValueError(f"model.{name}={v!r}: allowed a probability from 0 to below 1")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"model.num_attention_heads={self.num_attention_heads}: allowed a divisor of "
                             f"hidden_size={self.hidden_size}")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"model.hidden_size/num_attention_heads={self.hidden_size // self.num_attention_heads}:"
                             " the head dimension must be even for RoPE")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    def check(self, parallel: ParallelConfig) -> None:
        """What Megatron asks of a layout beyond LiveR's own checks (``Layout``), refused with the
        field named: TP divides the heads, the query groups, the FFN and the vocabulary (Megatron
        pads the vocabulary only in its training script; this engine does not pad). How the layers
        split over a pipeline's stages: ``stages``."""
        tp = parallel.tp
        for name, n in (("num_attention_heads", self.num_attention_heads), ("num_query_groups", self.query_groups),
                        ("ffn_hidden_size", self.ffn_hidden_size), ("vocab_size", self.vocab_size)):
            if n % tp:
                raise ValueError(f"parallel.tp={tp}: Megatron-Core needs it to divide model.{name}={n}")

    def transformer_config(self, parallel: ParallelConfig, split: list[int], dtype: Any, **extra: Any) -> Any:
        """Megatron's ``TransformerConfig`` of this model under ``parallel`` (its TP and PP degrees;
        ``split``: each stage's layer count) in ``dtype`` (a torch dtype); ``extra``: more of its
        fields."""
        import torch

        from liver.engine.megatron.model import megatron
        first, last = stages(parallel, split)
        return megatron().TransformerConfig(
            num_layers=self.num_layers, hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups, ffn_hidden_size=self.ffn_hidden_size,
            tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
            num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
            pipeline_dtype=dtype if parallel.pp > 1 else None, params_dtype=dtype,
            bf16=dtype == torch.bfloat16, gated_linear_unit=self.swiglu,
            activation_func=torch.nn.functional.silu if self.swiglu else torch.nn.functional.gelu,
            normalization="RMSNorm", add_bias_linear=False, init_method_std=self.init_method_std,
            hidden_dropout=self.hidden_dropout, attention_dropout=self.attention_dropout,
            use_cpu_initialization=True, **extra)


def stages(parallel: ParallelConfig, split: list[int]) -> tuple[int | None, int | None]:
    """Megatron's ``num_layers_in_first_pipeline_stage`` and ``..._last_...`` for ``split`` (each
    stage's layer count, as LiveR's ``Layout`` splits them; None where a count equals the middle
    stages'). Megatron builds a stage's layers by these and its pipeline rank (its layer layout
    string reads its global ``parallel_state``, which this engine does not set up), so the stages
    between the first and the last hold equal runs: else ValueError naming
    ``parallel.layers_per_stage``."""
    if parallel.pp == 1:
        return None, None
    if parallel.pp == 2:
        return (None, None) if split[0] == split[1] else (split[0], split[1])
    middle = set(split[1:-1])
    if len(middle) != 1:
        raise ValueError(f"parallel.layers_per_stage={split}: Megatron-Core needs the stages between the first "
                         "and the last to hold equal runs of layers")
    m = middle.pop()
    return (None if split[0] == m else split[0]), (None if split[-1] == m else split[-1])
