"""What the layer checks, the target choice, the cost model and the simulator know of a model: its
engine's answer (``EngineAdapter.facts``), whatever the model's own configuration looks like."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelFacts:
    """- ``params``: parameters, all of them (what one replica holds whole);
    - ``layers``: the blocks a pipeline stage holds a run of (the unit ``Layout`` splits);
    - ``width``: the width of its matrix multiplies (tensor parallelism cuts it);
    - ``seq_len``: tokens a sample;
    - ``flops_per_token``: a training step's FLOPs a token, forward and backward."""

    params: int
    layers: int
    width: int
    seq_len: int
    flops_per_token: float

    def __post_init__(self) -> None:
        for name in ("params", "layers", "width", "seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"model facts: {name}={v!r}: must be a positive integer")
        if not self.flops_per_token > 0:
            raise ValueError(f"model facts: flops_per_token={self.flops_per_token!r}: must be positive")

    @classmethod
    def decoder(cls, params: int, layers: int, width: int, seq_len: int) -> "ModelFacts":
        """A decoder-only transformer's: 6 FLOPs a parameter a token for the matrix multiplies of
        the forward and backward passes, and attention's scores and sums (12 x layers x width x
        sequence length)."""
        return cls(params=params, layers=layers, width=width, seq_len=seq_len,
                   flops_per_token=6.0 * params + 12.0 * layers * width * seq_len)
