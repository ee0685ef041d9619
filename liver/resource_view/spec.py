"""Logical tensors: the layout-independent description of training state (Abstract Resource View)."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "uint8": 1}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One logical tensor of the training state.

    ``layer`` orders tensors for streaming and decides the pipeline stage that owns them
    (-1: the embedding, before the first block; ``num_layers``: final norm and output head).
    ``shard_dim`` is the dimension split over tensor-parallel ranks, or None when replicated.
    Optimizer moments carry their parameter's geometry; ``param`` names that parameter.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    layer: int
    shard_dim: int | None
    kind: str = "param"  # the engine's name for what it is: "param", or an optimizer state's kind
    param: str = ""

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

