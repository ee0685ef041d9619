"""Configuration dataclasses: the model, the parallel degrees and the training hyper-parameters.

Pure code, no torch.distributed. Every check raises ``ValueError`` naming the field, the value
given and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from liver.topology.facts import ModelFacts


def _positive(owner: str, name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}.{name}={value!r}: must be a positive integer")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, SwiGLU, untied embedding and output head."""

    num_layers: int = 4
    hidden_size: int = 64
    num_heads: int = 4
    ffn_size: int = 128
    vocab_size: int = 256
    seq_len: int = 32
    # The vocabulary is padded (as Megatron does) so that every TP degree in use divides it;
    # padded logits are masked out of the loss, so padding never changes the numbers.
    vocab_multiple: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "ffn_size", "vocab_size",
                     "seq_len", "vocab_multiple"):
            _positive("model", name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.num_heads={self.num_heads} does not divide "
                             f"hidden_size={self.hidden_size}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"model.hidden_size/num_heads={self.hidden_size // self.num_heads}: "
                             "the head dimension must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_multiple
        return (self.vocab_size + m - 1) // m * m

    def num_params(self) -> int:
        h, f, v = self.hidden_size, self.ffn_size, self.padded_vocab_size
        per_layer = 4 * h * h + 3 * h * f + 2 * h
        return self.num_layers * per_layer + 2 * v * h + h

    def describe(self) -> str:
        return (f"{self.num_layers} layers, hidden {self.hidden_size}, {self.num_heads} heads, ffn {self.ffn_size}, "
                f"vocab {self.vocab_size}, seq {self.seq_len}")

    def facts(self) -> ModelFacts:
        """The reference engine's model as the rest of LiveR knows it (``EngineAdapter.facts``)."""
        return ModelFacts.decoder(self.num_params(), self.num_layers, self.hidden_size, self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    """Tensor, pipeline and data parallel degrees, and optionally an explicit (uneven) split
    of layers over pipeline stages."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    layers_per_stage: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            _positive("parallel", name, getattr(self, name))
        if self.layers_per_stage is not None:
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))
            if len(self.layers_per_stage) != self.pp:
                raise ValueError(f"parallel.layers_per_stage={list(self.layers_per_stage)} has "
                                 f"{len(self.layers_per_stage)} entries; pp={self.pp} are required")
            for n in self.layers_per_stage:
                if not isinstance(n, int) or n < 1:
                    raise ValueError(f"parallel.layers_per_stage={list(self.layers_per_stage)}: "
                                     "every stage needs at least one layer")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def short(self) -> str:
        s = f"tp{self.tp}pp{self.pp}dp{self.dp}"
        if self.layers_per_stage is not None:
            s += "[" + ",".join(map(str, self.layers_per_stage)) + "]"
        return s

    def spelt(self) -> str:
        """As an event names it: ``tp,pp,dp`` or ``tp,pp,dp:l0/l1/...`` (``parse``'s form)."""
        s = f"{self.tp},{self.pp},{self.dp}"
        return s + (":" + "/".join(map(str, self.layers_per_stage)) if self.layers_per_stage is not None else "")

    @staticmethod
    def from_short(text: str) -> "ParallelConfig":
        """``short``'s form back (``tp2pp1dp2``, ``tp1pp2dp1[3,1]``); ValueError naming it otherwise."""
        import re
        m = re.fullmatch(r"tp(\d+)pp(\d+)dp(\d+)(?:\[(\d+(?:,\d+)*)\])?", text)
        if not m:
            raise ValueError(f"parallel={text!r}: expected tpXppYdpZ or tpXppYdpZ[l0,l1,...]")
        lps = tuple(int(x) for x in m.group(4).split(",")) if m.group(4) else None
        return ParallelConfig(tp=int(m.group(1)), pp=int(m.group(2)), dp=int(m.group(3)), layers_per_stage=lps)

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp,
                "layers_per_stage": list(self.layers_per_stage) if self.layers_per_stage else None}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ParallelConfig":
        lps = d.get("layers_per_stage")
        return ParallelConfig(tp=d["tp"], pp=d["pp"], dp=d["dp"],
                              layers_per_stage=tuple(lps) if lps else None)

    @staticmethod
    def parse(text: str) -> "ParallelConfig":
        """Parse ``tp,pp,dp`` or ``tp,pp,dp:l0/l1/...`` (explicit layers per stage)."""
        head, _, split = text.partition(":")
        parts = head.split(",")
        if len(parts) != 3:
            raise ValueError(f"parallel={text!r}: expected 'tp,pp,dp' (three integers)")
        try:
            tp, pp, dp = (int(p) for p in parts)
            lps = tuple(int(x) for x in split.split("/")) if split else None
        except ValueError:
            raise ValueError(f"parallel={text!r}: expected integers as 'tp,pp,dp[:l0/l1/..]'")
        return ParallelConfig(tp=tp, pp=pp, dp=dp, layers_per_stage=lps)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Hyper-parameters that stay fixed across reconfigurations (the global batch included)."""

    global_batch: int = 8
    micro_batch: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 10
    total_steps: int = 10000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 1234
    corpus_bytes: int = 4 << 20
    data: str = ""
    """A corpus made by ``liver data prepare`` (its directory); empty: the first ``corpus_bytes``
    of the Python standard library's sources, byte-level (liver/data)."""

    def __post_init__(self) -> None:
        for name in ("global_batch", "micro_batch", "total_steps", "corpus_bytes"):
            _positive("train", name, getattr(self, name))
        if self.data:
            d = Path(self.data).expanduser().resolve()
            if not (d / "meta.json").is_file() or not (d / "tokens.bin").is_file():
                raise ValueError(f"train.data={self.data!r}: not a corpus made by `liver data prepare` (no meta.json "
                                 f"and tokens.bin in it); allowed such a directory, or empty for the standard "
                                 f"library's sources")
            object.__setattr__(self, "data", str(d))  # (workers may start elsewhere)
        # (each a finite number in its range: a NaN compares false with every bound, and an
        # infinite learning rate or a zero epsilon trains to NaN from the second step)
        for name, ok, allowed in (("lr", lambda v: v > 0, "a finite number > 0"),
                                  ("min_lr", lambda v: 0 <= v <= self.lr, f"a finite number from 0 to lr={self.lr}"),
                                  ("weight_decay", lambda v: v >= 0, "a finite number >= 0"),
                                  ("beta1", lambda v: 0 <= v < 1, "a number from 0 to below 1"),
                                  ("beta2", lambda v: 0 <= v < 1, "a number from 0 to below 1"),
                                  ("eps", lambda v: v > 0, "a finite number > 0"),
                                  ("grad_clip", lambda v: v >= 0, "a finite number >= 0 (0: no clipping)")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise ValueError(f"train.{name}={v!r}: allowed {allowed}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps!r}: must be an integer >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    """Everything that defines a training job apart from its parallel layout. ``model``: the
    model's configuration, of the class its engine declares (``EngineAdapter.model_config``: a
    frozen dataclass; the reference engine's and the presets' is ``ModelConfig``), filled from the
    job file's ``[job.model]`` table by the job's configuration (``liver.config``)."""

    model: Any = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # "float32" everywhere; "bfloat16" compute with fp32 master weights (GPU).
    compute_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"job.compute_dtype={self.compute_dtype!r}: allowed 'float32', 'bfloat16'")

    def to_dict(self) -> dict[str, Any]:
        return {"model": asdict(self.model), "train": self.train.to_dict(), "compute_dtype": self.compute_dtype}
