"""Training data for a recipe: a tokenized corpus read by global sample position.

``batch(job, dp_rank, dp_size, position)`` gives a data-parallel rank its rows of the step that
starts at sample ``position``: sample k is the same window of the corpus whatever the layout, so the
global batch and the sample order do not change when the data-parallel size does (a per-rank
stateful loader cannot follow that change). The corpus is ``job.train.data``, a directory made by
``liver data prepare FILES --out DIR`` (``prepare.py``), memory-mapped; unset, the Python standard
library's own sources, byte-level (every machine has them).
"""

from typing import Any

__all__ = ["Tokens", "batch", "tokens_of"]


def __getattr__(name: str) -> Any:
    """``liver.data.batch`` and its kin, imported (with torch) at first use: ``liver data prepare``'s
    parser, registered by every ``liver`` command, imports this package."""
    if name in __all__:
        from liver.data import tokens
        return getattr(tokens, name)
    raise AttributeError(f"module 'liver.data' has no attribute {name!r}")
