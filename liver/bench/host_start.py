"""``liver bench host-start``: what a restart costs one host when several of its processes start at
once, as a stop-and-restart starts every rank of a node together (and a cold joiner beside them):
``k`` fresh interpreters launched together, each importing torch, creating its CUDA context (on
a GPU), reading a shard of its own from the host's disk (evicted from the page cache first) and
copying it to its device. Each ``k`` of ``--procs`` is run ``--repeats`` times, the counts
interleaved; per run the slowest process of each phase is taken (a restart waits for its slowest
rank), and the median over the runs is reported beside its ratio to one process alone: how much
the host's processes share of its CPUs, its driver and its storage. Nothing else runs.

On a machine with fewer GPUs than processes, the processes share the GPUs there are (said in the
result): the CUDA context's cost is then an upper bound for one context per GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PHASES = ("import_s", "cuda_s", "read_s", "to_device_s", "total_s")
_BLOCK = 16 << 20  # the shards' contents: one random block, written again and again


def child(spec_path: str) -> None:
    """One process: its phases' ends as wall-clock times, written to its ``out`` file."""
    spec = json.loads(Path(spec_path).read_text())
    t: dict[str, float] = {"launch": spec["launch"]}
    import torch

    t["imported"] = time.time()
    device = torch.device("cpu")
    if spec["device"] == "cuda":
        device = torch.device("cuda", spec["index"] % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
    t["context"] = time.time()
    size = os.path.getsize(spec["file"])
    buf = bytearray(size)
    view = memoryview(buf)
    with open(spec["file"], "rb", buffering=0) as f:
        got = 0
        while got < size:
            n = f.readinto(view[got:got + (64 << 20)])
            if not n:
                raise RuntimeError(f"{spec['file']}: ended after {got} of {size} bytes")
            got += n
    t["read"] = time.time()
    host = torch.frombuffer(buf, dtype=torch.uint8)
    if device.type == "cuda":
        host.to(device)
        torch.cuda.synchronize(device)
    t["on_device"] = time.time()
    Path(spec["out"]).write_text(json.dumps(t))


def _shards(directory: Path, k: int, mib: int) -> list[Path]:
    """``k`` shard files of ``mib`` MiB, written once, then evicted from the page cache."""
    block = os.urandom(_BLOCK)
    files = []
    for i in range(k):
        f = directory / f"shard{i}.bin"
        if not f.exists() or f.stat().st_size != mib << 20:
            with open(f, "wb") as fh:
                left = mib << 20
                while left > 0:
                    fh.write(block[: min(left, _BLOCK)])
                    left -= _BLOCK
                fh.flush()
                os.fsync(fh.fileno())
        files.append(f)
    return files


def _evict(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _once(directory: Path, k: int, mib: int, device: str) -> dict[str, Any]:
    """One run of ``k`` processes launched together: the slowest of each phase."""
    files = _shards(directory, k, mib)
    _evict(files)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs, outs = [], []
    launch = time.time()
    for i, f in enumerate(files):
        out = directory / f"out{i}.json"
        out.unlink(missing_ok=True)
        spec = directory / f"spec{i}.json"
        spec.write_text(json.dumps({"launch": launch, "device": device, "index": i, "file": str(f), "out": str(out)}))
        procs.append(subprocess.Popen([sys.executable, "-m", "liver.bench.host_start", str(spec)], env=env))
        outs.append(out)
    for p in procs:
        if p.wait(600) != 0:
            raise RuntimeError(f"a host-start process exited with {p.returncode}")
    ts = [json.loads(o.read_text()) for o in outs]
    phase = {"import_s": [t["imported"] - t["launch"] for t in ts],
             "cuda_s": [t["context"] - t["imported"] for t in ts],
             "read_s": [t["read"] - t["context"] for t in ts],
             "to_device_s": [t["on_device"] - t["read"] for t in ts],
             "total_s": [t["on_device"] - t["launch"] for t in ts]}
    read_span = max(t["read"] for t in ts) - min(t["context"] for t in ts)
    return {**{k_: max(v) for k_, v in phase.items()},
            "read_gb_s": k * (mib << 20) / read_span / 1e9 if read_span > 0 else None}


def run(procs: list[int], read_mib: int = 256, repeats: int = 3, run_dir: Path | None = None) -> dict[str, Any]:
    import torch

    if not procs or min(procs) < 1 or read_mib < 1 or repeats < 1:
        raise ValueError(f"--procs={procs} --read-mib={read_mib} --repeats={repeats}: allowed positive counts")
    if run_dir is not None and not Path(run_dir).is_dir():
        raise ValueError(f"--run-dir={str(run_dir)!r}: no such directory; allowed an existing one (its disk is measured)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in procs}
    with tempfile.TemporaryDirectory(dir=run_dir) as d:
        for r in range(repeats):
            order = procs[r % len(procs):] + procs[: r % len(procs)]  # (interleaved, a new first each round)
            for k in order:
                runs[k].append(_once(Path(d), k, read_mib, device))
    rows = []
    one = {p: statistics.median(x[p] for x in runs[min(procs)]) for p in PHASES}
    for k in procs:
        med = {p: statistics.median(x[p] for x in runs[k]) for p in PHASES}
        rows.append({"procs": k, **med,
                     "spread": {p: [min(x[p] for x in runs[k]), max(x[p] for x in runs[k])] for p in PHASES},
                     "read_gb_s": statistics.median(x["read_gb_s"] for x in runs[k] if x["read_gb_s"]),
                     f"ratio_to_{min(procs)}": {p: med[p] / one[p] if one[p] > 0 else None for p in PHASES}})
    return {"device": device, "gpus": gpus, "cpus": os.cpu_count(), "read_mib_per_process": read_mib,
            "repeats": repeats, "shared_gpus": device == "cuda" and max(procs) > gpus,
            "what": "k processes started together on one host; per run the slowest process of each phase; "
                    "median over the runs, min and max beside it",
            "rows": rows, "runs": {str(k): v for k, v in runs.items()}}


if __name__ == "__main__":
    child(sys.argv[1])
