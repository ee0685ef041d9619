"""A worker's traffic with the controller, off the training thread: its step records go out, the
controller's wish comes in, and its heartbeat is kept, each on a store connection of its own.

Between two steps the training thread only hands its step record over (``post``) and reads the
latest wish it already holds (``wish``): no store round trip, no JSON, no file write and no log
line sits between two steps (the paper's per-step overhead: DESIGN.md, "Measurements"). Two
threads do the rest:

- ``liver-post``: the records, in the order posted: rank 0's to the store (``progress``, with the
  recent step ends) and to ``steps.jsonl``, and each step's log line; between them, and at least
  every ``BEAT_S``, the process's heartbeat (``beat/{proc}``: the controller takes a process that
  stops writing it for hung);
- ``liver-wish``: blocked on the next wish's key (``Wish.publish``), so a wish reaches the
  training thread as soon as it is written, with no polling.

``drain`` waits until every record posted so far is out: before a process switches generation,
stops or exits, so that ranks 0 of two generations never write out of order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import queue
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from liver import logs
from liver.config.fields import to_dict
from liver.protocol import store as protocol
from liver.protocol.messages import Progress, Wish, beat_key, read

BEAT_S = 0.5
PEAK_EVERY_S = 1.0
_WAIT = timedelta(days=365)  # a wish may never come: the reader waits for as long as the process lives


@dataclasses.dataclass(frozen=True, slots=True)
class Post:
    """One step's record: where it goes. ``ends``: rank 0's recent (step, end time) pairs, which its
    store record carries (a step trigger's exact time, seen late by the controller). ``gpu``: the
    device whose peak reserved memory the record gets (read here: torch's allocator statistics
    are a dict of hundreds of entries, built at each read)."""

    record: Progress
    to_store: bool = False
    log_as: str | None = None  # its step line's prefix (None: not logged here)
    ends: tuple[tuple[int, float], ...] = ()
    gpu: torch.device | None = None


class Courier:
    def __init__(self, connect, proc: int, steps_path: Path) -> None:
        """``connect()``: a new connection to the job's keys in its store (``protocol.store.run_store``; one per thread)."""
        self._connect, self._proc, self._steps_path = connect, proc, steps_path
        self._out: queue.SimpleQueue[Post | threading.Event] = queue.SimpleQueue()
        self._wish = Wish()
        self._wish_error: BaseException | None = None
        self._wish_known = threading.Event()
        self._steps = None
        self._posting_gone = False  # its store went away (the job is ending): nothing more goes out
        self._silenced = False      # fenced (``runtime.fence``): nothing more goes out
        self.contact = time.time()  # when the store last answered (its heartbeat's round trip)
        self._peak, self._peak_at = 0.0, 0.0
        threading.Thread(target=self._posting, args=(connect(),), name="liver-post",
                         daemon=True).start()
        threading.Thread(target=self._watching, args=(connect(),), name="liver-wish",
                         daemon=True).start()

    # ---- the training thread's side ----------------------------------------------------------
    def post(self, post: Post) -> None:
        self._out.put(post)

    def wish(self) -> Wish:
        """The latest wish the controller published (waits for the first read only); the reader's
        error, if its connection broke, as the store read it replaces would have raised it."""
        self._wish_known.wait()
        if self._wish_error is not None:
            raise self._wish_error
        return self._wish

    def silence(self) -> None:
        """No record goes out from now on (the process was fenced: its steps are not the job's)."""
        self._silenced = True

    def drain(self, timeout_s: float = 10.0) -> None:
        """Returns once every record posted so far is out (or after ``timeout_s``, or at once when
        the posting thread has ended: nothing would take them)."""
        done, end = threading.Event(), time.time() + timeout_s
        self._out.put(done)
        while not done.wait(0.05) and not self._posting_gone and time.time() < end:
            pass

    # ---- its threads -------------------------------------------------------------------------
    def _posting(self, store: dist.Store) -> None:
        key, beat = beat_key(self._proc), 0.0
        while True:
            try:
                item = self._out.get(timeout=max(0.0, beat + BEAT_S - time.time()))
            except queue.Empty:
                item = None
            try:
                if isinstance(item, Post) and not self._silenced:
                    self._send(store, item)
                if time.time() >= beat + BEAT_S:
                    store.set(key, repr(time.time()))
                    store.check([key])  # (a round trip: a set is never answered, so it proves no contact)
                    beat = self.contact = time.time()
            except RuntimeError:  # the controller is gone: the job is ending
                self._posting_gone = True
                if isinstance(item, threading.Event):
                    item.set()
                return
            except Exception as err:  # (a record that cannot be written: said, and the next one tried)
                print(f"[liver] proc {self._proc}: a step record was not written: {type(err).__name__}: {err}",
                      flush=True)
            if isinstance(item, threading.Event):
                item.set()

    def _send(self, store: dist.Store, post: Post) -> None:
        rec = post.record
        if post.gpu is not None:
            rec = dataclasses.replace(rec, memory_gib=self._peak_gib(post.gpu))
        line = post.log_as + step_line(rec) if post.log_as is not None else None
        if post.to_store:
            ends = {str(k): t for k, t in post.ends}
            store.set(Progress.KEY, json.dumps(to_dict(dataclasses.replace(rec, ends=ends))))
            if self._steps is None:  # (appends of whole lines: ranks 0 of later generations share it)
                self._steps = open(self._steps_path, "a", buffering=1)
            self._steps.write(json.dumps(to_dict(rec)) + "\n")
        if line is not None:
            logs.STEPS.info(line)

    def _peak_gib(self, device: torch.device) -> float:
        """The device's peak reserved memory, read at most once a second (a peak: it changes
        rarely; the reading costs a tenth of a millisecond or more of the GIL)."""
        if time.time() - self._peak_at >= PEAK_EVERY_S:
            stats = torch.cuda.memory_stats_as_nested_dict(device)  # (not flattened and sorted)
            self._peak, self._peak_at = stats["reserved_bytes"]["all"]["peak"] / 2**30, time.time()
        return self._peak

    def _watching(self, store: dist.Store) -> None:
        try:
            n = store.add(Wish.VERSION, 0)
            if n:
                self._wish = read(store, Wish.version_key(n), Wish)
        except RuntimeError as err:
            self._wish_error = err
        self._wish_known.set()
        while self._wish_error is None:
            try:
                store.wait([Wish.version_key(n + 1)], _WAIT)
                n += 1
                self._wish = read(store, Wish.version_key(n), Wish)
            except RuntimeError as err:  # the store's connection broke (the controller is gone)
                self._wish_error = err


def step_line(p: Progress) -> str:
    """One line per step, as torchtitan prints it (memory and MFU where there is a GPU)."""
    norm = "-" if p.grad_norm is None else f"{p.grad_norm:.4f}"
    line = (f"step: {p.step:<5d} loss: {p.loss:.4f}  grad_norm: {norm}  "
            f"tps: {p.tokens_per_s:,.0f}  time: {p.step_s * 1e3:.1f}ms")
    if p.memory_gib is not None:
        line += f"  memory: {p.memory_gib:.2f}GiB"
    if p.mfu is not None:
        line += f"  mfu: {p.mfu:.1%}"
    line += f"  gen: {p.generation} {p.parallel}" + ("  (preparing)" if p.preparing else "")
    return line + ("  NON-FINITE LOSS" if not math.isfinite(p.loss) else "")
