"""A token sequence, memory-mapped from ``liver data prepare``'s output or the standard library's
sources in memory, and the windows that are its samples."""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

META = "meta.json"
TOKENS = "tokens.bin"


class Tokens:
    """``data``: the tokens (a 1-D array, possibly a memory map), ``vocab_size``: their range."""

    def __init__(self, data: np.ndarray, vocab_size: int, fingerprint: str, source: str) -> None:
        if data.size < 1024:
            raise ValueError(f"corpus {source}: {data.size} tokens; at least 1,024 needed")
        self.data, self.vocab_size, self.fingerprint, self.source = data, vocab_size, fingerprint, source

    @staticmethod
    def open(directory: str | Path) -> "Tokens":
        """A corpus ``liver data prepare`` wrote (its tokens memory-mapped: read as sampled)."""
        d = Path(directory)
        try:
            meta = json.loads((d / META).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"train.data={str(directory)!r}: not a corpus made by `liver data prepare` "
                             f"({type(e).__name__}: {e})") from None
        data = np.memmap(d / TOKENS, dtype=np.dtype(meta["dtype"]), mode="r", shape=(int(meta["tokens"]),))
        return Tokens(data, int(meta["vocab_size"]), meta["sha256"][:16], str(d))

    def windows(self, first: int, count: int, length: int, seed: int) -> np.ndarray:
        """Samples [first, first + count): each ``length`` tokens at an offset that a hash of
        (seed, sample) gives: any rank makes any sample without the others."""
        span = self.data.size - length
        if span <= 0:
            raise ValueError(f"corpus {self.source}: {self.data.size} tokens, shorter than a sample of {length}")
        offs = _offsets(seed, np.arange(first, first + count), span)
        return np.asarray(self.data[offs[:, None] + np.arange(length)[None, :]], dtype=np.int64)


@lru_cache(maxsize=4)
def stdlib(max_bytes: int) -> Tokens:
    """The first ``max_bytes`` bytes of the standard library's .py files (its tests and
    site-packages left out), concatenated in sorted path order, one token a byte."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in _sources(root):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    raw = b"".join(chunks)[:max_bytes]
    return Tokens(np.frombuffer(raw, dtype=np.uint8), 256, hashlib.sha256(raw).hexdigest()[:16],
                  f"the standard library's sources under {root}")


def _sources(directory: Path):
    """The .py files under ``directory`` in sorted path order, lazily (the walk stops where the
    corpus is full), leaving out site-packages and test directories and links to directories."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            if e.name not in ("site-packages", "test"):
                yield from _sources(Path(e.path))
        elif e.name.endswith(".py"):
            yield Path(e.path)


@lru_cache(maxsize=4)
def _opened(directory: str) -> Tokens:
    return Tokens.open(directory)


def tokens_of(train) -> Tokens:
    """The corpus of a job's ``TrainConfig``: ``train.data``, else the standard library's."""
    return _opened(train.data) if train.data else stdlib(train.corpus_bytes)


def batch(job, dp_rank: int, dp_size: int, position: int, seq_len: int | None = None,
          vocab: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel rank ``dp_rank``'s inputs and targets ([rows, seq_len] each) of the step that
    starts at sample ``position`` (``job.train.global_batch`` samples, split evenly over
    ``dp_size`` ranks). Tokens beyond the model's vocabulary (``vocab``) fold into it (modulo).
    ``seq_len`` and ``vocab``: by default the model configuration's fields of those names (a
    recipe whose configuration names them otherwise passes them)."""
    g = job.train.global_batch
    seq_len = job.model.seq_len if seq_len is None else seq_len
    vocab = job.model.vocab_size if vocab is None else vocab
    if g % dp_size:
        raise ValueError(f"train.global_batch={g} does not split over {dp_size} data-parallel ranks")
    n = g // dp_size
    win = tokens_of(job.train).windows(position + dp_rank * n, n, seq_len + 1, job.train.seed) % vocab
    t = torch.from_numpy(win)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def _offsets(seed: int, indices: np.ndarray, span: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = indices.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(span)).astype(np.int64)
