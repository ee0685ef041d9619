"""Deterministic data over a real text corpus that exists offline on every machine: byte-level
tokens of the Python standard library's source files, read in sorted path order.

Sample ``i`` is a window of seq_len + 1 bytes at an offset given by a hash of (seed, i), so any
rank can produce any sample without reading the others; the position in the sample stream
(``consumed_samples``) is part of the training state.
"""

from __future__ import annotations

import hashlib
import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch


@lru_cache(maxsize=4)
def corpus(max_bytes: int) -> np.ndarray:
    """The first ``max_bytes`` bytes of the stdlib's .py files, concatenated in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    buf = np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)
    if buf.size < 1024:
        raise RuntimeError(f"corpus: only {buf.size} bytes of Python sources under {root}")
    return buf


def corpus_fingerprint(max_bytes: int) -> str:
    return hashlib.sha256(corpus(max_bytes).tobytes()).hexdigest()[:16]


def _offsets(seed: int, indices: np.ndarray, span: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = indices.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(span)).astype(np.int64)


def batch(first_sample: int, count: int, seq_len: int, vocab_size: int, seed: int,
          corpus_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples [first_sample, first_sample + count): (inputs, targets), each [count, seq_len]."""
    data = corpus(corpus_bytes)
    span = data.size - seq_len - 1
    offs = _offsets(seed, np.arange(first_sample, first_sample + count), span)
    win = data[offs[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int64) % vocab_size
    t = torch.from_numpy(win)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()
