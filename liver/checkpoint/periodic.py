"""Periodic asynchronous checkpoints: the fail-stop fallback (invariant I4).

Every ``every`` steps the engine's shards are copied to host memory at the iteration boundary
(the only part on the training path) and a background thread writes them with DCP over the
World's CPU (gloo) groups, so the write never shares a communicator with training. When rank 0's
write returns, DCP has written the metadata of every rank: the checkpoint is complete, rank 0 takes
a checksum of its files, and ``latest.json`` is replaced atomically to point at it (and at the one
before it). A recovery reads the newest checkpoint whose files still match their checksum: a
corrupt newest one (a bad disk, a torn copy) is passed over for the one before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

from liver.checkpoint.dcp import _state_dict
from liver.host import faults
from liver.world.broken import broken_group
from liver.engine.interface import TrainingEngine as Engine

LATEST = "latest.json"
log = logging.getLogger("liver.checkpoint")


def checksum(path: str | Path) -> str:
    """sha256 over a checkpoint's files (names and bytes, in name order)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).rglob("*")):
        if f.is_file():
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def _record(directory: str | Path) -> dict[str, Any] | None:
    f = Path(directory) / LATEST
    try:
        return json.loads(f.read_text()) if f.exists() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def latest(directory: str | Path, verify: bool = False) -> dict[str, Any] | None:
    """The newest complete checkpoint under ``directory`` ({step, path, parallel, ...}) or None.
    ``verify``: the newest whose files match their checksum (the one before it otherwise)."""
    rec = _record(directory)
    if not verify:
        return rec
    for r in (rec, (rec or {}).get("previous")):
        if r is None:
            continue
        if "sha256" not in r or (Path(r["path"]).is_dir() and checksum(r["path"]) == r["sha256"]):
            return r
        logging.getLogger("liver.controller").warning(f"checkpoint {r['path']} does not match its checksum: "
                                                      f"passed over")
    return None


def resolve(path: str | Path) -> str:
    """The one checkpoint ``path`` names, as an absolute path: a run's checkpoint directory (its
    newest whole one, checksum verified) or one checkpoint written whole (DCP's metadata there);
    ValueError naming ``checkpoint.start_from`` otherwise."""
    p = Path(path).expanduser().resolve()
    if (p / ".metadata").is_file():
        return str(p)
    if (p / LATEST).is_file():
        rec = latest(p, verify=True)
        if rec is None:
            raise ValueError(f"checkpoint.start_from={str(path)!r}: no checkpoint there matches its checksum")
        return str(Path(rec["path"]).resolve())
    raise ValueError(f"checkpoint.start_from={str(path)!r}: allowed a run's checkpoint directory (with {LATEST}) or "
                     f"one checkpoint written whole (with DCP's .metadata)")


def saved_step(path: str | Path) -> int | None:
    """The training step a checkpoint holds (its scalars' ``step``), read without its tensors;
    None where it cannot be read."""
    import warnings

    try:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch.distributed is not initialised here: one process reads)
            return int(_load_state_dict_from_keys(keys={"scalars"}, checkpoint_id=str(path))["scalars"]["step"])
    except Exception:  # (a private function of torch's: absent in another version; an unreadable file)
        return None


def check_matches(path: str | Path, specs) -> None:
    """The checkpoint at ``path`` holds every logical tensor of ``specs`` with its global shape
    (DCP reshards to any layout, never to another model); ValueError naming what differs."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:  # an unreadable metadata file: the checkpoint is not one
        raise ValueError(f"checkpoint.start_from={str(path)!r}: its metadata is unreadable ({type(e).__name__})") \
            from None
    for s in specs:
        m = saved.get(s.name)
        if not isinstance(m, TensorStorageMetadata):
            raise ValueError(f"checkpoint.start_from={str(path)!r}: it holds no tensor {s.name!r} of the job's model "
                             f"(another model's checkpoint?)")
        if tuple(m.size) != tuple(s.shape):
            raise ValueError(f"checkpoint.start_from={str(path)!r}: tensor {s.name!r} has shape {tuple(m.size)} "
                             f"there, {tuple(s.shape)} in the job's model")


def _why(e: BaseException) -> str:
    """A failed write's cause in one line: DCP gathers every rank's (rank: its exception)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"rank {r}: {type(x[0]).__name__}: {x[0]}" for r, x in sorted(failures.items()))[:300]
    return f"{type(e).__name__}: {e}"[:300]


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer, with the fault matrix's full disk (``liver.host.faults``: "disk-full")
    at the end of this process's data: its files are written, DCP's metadata never is."""

    def __init__(self, path: str, proc: int, step: int) -> None:
        super().__init__(path)
        self.proc, self.step = proc, step

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        written.wait()
        faults.at("disk-full", self.proc, self.step)
        return written


def prune(directory: str | Path, keep: int) -> list[Path]:
    """Remove the checkpoints older than the newest ``keep`` published ones (``latest.json`` and
    the ones it points at are never among them; a write still in flight, newer than the latest, is
    not touched); returns what was removed."""
    import shutil

    directory = Path(directory)
    rec = _record(directory)
    if rec is None:
        return []
    published = sorted((int(p.name[4:]), p) for p in directory.glob("step*")
                       if p.name[4:].isdigit() and (p / ".metadata").exists() and int(p.name[4:]) <= rec["step"])
    kept = {p for _, p in published[-keep:]} | {Path(rec["path"])} | \
        ({Path(rec["previous"]["path"])} if rec.get("previous") else set())
    oldest_kept = min(int(p.name[4:]) for p in kept if p.name[4:].isdigit())
    gone = [p for p in directory.glob("step*") if p.name[4:].isdigit() and int(p.name[4:]) < oldest_kept
            and p not in kept]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


class PeriodicCheckpointer:
    def __init__(self, directory: str | Path, every: int, proc: int = 0, keep: int = 3) -> None:
        if every < 0:
            raise ValueError(f"checkpoint interval every={every}: allowed 0 (off) or a positive step count")
        self.directory = Path(directory)
        self.every = every
        self.keep = keep
        self.proc = proc
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.failures = 0  # written checkpoints failed in a row (0 after a good one)
        self.written: list[dict[str, Any]] = []
        self.snapshot_s: list[float] = []
        self._ended = 0  # writes that ended (published or failed): ``standing`` reads latest.json again
        self._read_at = -1
        self._published: tuple[int | None] | None = None

    def standing(self) -> dict[str, Any]:
        """What a step's record says of checkpoints: the newest published whole (None: none
        stands), and the failures since it, with the latest's cause. ``latest.json`` is read again
        only once a write of this process ended (not every step)."""
        if self._published is None or self._ended != self._read_at:
            self._read_at, rec = self._ended, _record(self.directory)
            self._published = (rec["step"] if rec else None,)
        return {"checkpoint_step": self._published[0], "checkpoint_failures": self.failures,
                "checkpoint_error": _why(self.error) if self.failures and self.error is not None else None}

    def due(self, engine: Engine) -> bool:
        return self.every > 0 and engine.step % self.every == 0

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, engine: Engine) -> bool:
        """Snapshot now, write in the background. Every rank of the World must call it at the same
        step (it is collective); the caller makes sure no rank is still writing the previous one."""
        if self.busy():
            raise RuntimeError("a periodic checkpoint is still being written on this rank")
        w = engine.world
        if "all" not in w.cpu_groups:
            raise RuntimeError("periodic checkpoints need the World built with cpu_groups=True")
        t0 = time.perf_counter()
        snap = {k: v.detach().to("cpu", copy=True) for k, v in engine.state.items()}
        sd = _state_dict(engine, snap, cpu=True)
        self.snapshot_s.append(time.perf_counter() - t0)
        step, path = engine.step, self.directory / f"step{engine.step:08d}"
        record = {"step": step, "path": str(path), "parallel": w.layout.parallel.to_dict(),
                  "generation": w.generation}
        group, is_rank0, single = w.cpu_groups["all"], w.rank == 0, w.layout.size == 1
        writer = _Writer(str(path), self.proc, step) if faults.armed("disk-full", self.proc) else None

        def write() -> None:
            try:
                dcp.save(sd, checkpoint_id=str(path), storage_writer=writer,
                         process_group=None if single else group.pg, no_dist=single)
                newer = _record(self.directory)
                if is_rank0 and (newer is None or newer["step"] < step):  # (a late write never goes back)
                    before = {k: v for k, v in newer.items() if k != "previous"} if newer else None
                    tmp = self.directory / f".{LATEST}.{os.getpid()}"
                    tmp.write_text(json.dumps({**record, "sha256": checksum(path), "written_at": time.time(),
                                               "previous": before}))
                    os.replace(tmp, self.directory / LATEST)
                    prune(self.directory, self.keep)
                self.written.append(record)
                self.failures = 0
                self._ended += 1
            except BaseException as e:  # a peer died mid-write, a full disk: the previous checkpoint stands
                if threading.current_thread() is not self._thread or broken_group(e):
                    # abandoned with its broken generation (a peer lost mid-write): no failure of the
                    # storage; the next generation checkpoints afresh
                    log.info(f"checkpoint of step {step} abandoned with its generation ({_why(e)})")
                    return
                self.error = e
                self.failures += 1
                self._ended += 1
                stands = _record(self.directory)
                log.warning(f"checkpoint of step {step} not written ({_why(e)}); "
                            + (f"the checkpoint of step {stands['step']} stands" if stands else
                               "no checkpoint stands: a fail-stop now restarts from step 0")
                            + f" ({self.failures} failed in a row); training goes on")

        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=write, name=f"ckpt-step{step}", daemon=True)
        self._thread.start()
        return True

    def abandon(self) -> None:
        """The generation broke under a write in flight: it never becomes the latest (rank 0 points
        ``latest.json`` at it only after every rank wrote), and its thread, blocked on the broken
        groups or failing, is left to end on its own; the next generation checkpoints afresh."""
        self._thread = None

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
