"""``liver data prepare FILES --out DIR``: local text files as one token sequence, byte-level.

Each file's bytes (a directory: every regular file under it, in sorted path order) are its tokens,
one per byte (vocabulary 256, no download, no model of its own), the files one after the other.
``DIR/tokens.bin`` holds them as little-endian uint16 (a tokenizer with a larger vocabulary fits the
same format), ``DIR/meta.json`` their count, vocabulary, the files and a SHA-256 of the tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from liver.data.tokens import META, TOKENS


def files_of(paths: list[str]) -> list[Path]:
    """The files named, directories expanded; ValueError naming a path that is neither."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"FILES: {str(p)!r} is neither a file nor a directory")
    if not out:
        raise ValueError(f"FILES: {paths!r} name no file")
    return out


def prepare(paths: list[str], out: str | Path) -> dict:
    files = files_of(paths)
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise ValueError(f"--out={str(d)!r}: exists and is not a directory")
    d.mkdir(parents=True, exist_ok=True)
    h, total = hashlib.sha256(), 0
    part = d / (TOKENS + ".partial")
    with open(part, "wb") as f:
        for path in files:
            tokens = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype("<u2")
            f.write(tokens.tobytes())
            h.update(tokens.tobytes())
            total += tokens.size
    if total < 1024:
        part.unlink()
        raise ValueError(f"FILES: {total} bytes in all; at least 1,024 needed")
    part.replace(d / TOKENS)
    meta = {"tokenizer": "bytes", "vocab_size": 256, "dtype": "<u2", "tokens": total, "sha256": h.hexdigest(),
            "files": [str(p) for p in files[:1000]], "file_count": len(files)}
    (d / META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta
