"""A survivor's mirror of the state it will hold after a switch, kept current beside training, so
that the switch moves only what was not mirrored (liver/transfer/precopy.py says what is).

Made in Prepare (``Mirror.make``), on a group of its own over the old generation's processes (no
communicator shared with training: a slice is copied in a thread while the training thread runs
its step). From the boundary where every rank is ready, one slice of layers a boundary:

- ``start_next``: the slice's shards are copied from the old engine's state into the mirror, in a
  thread, while the next step's forward and backward run (they read, and do not change, the state);
- ``before_update`` (the engine calls it right before its optimizer update changes the state): the
  slice's copy is waited for; the slice now holds the state as of the step before;
- ``after_update`` (right after the update, the engine hands over its reduced gradients and the
  update's scalars): every mirrored slice receives the gradients of its boxes from their old
  owners (the same plan, the gradients in place of the parameters) and applies the same update
  (``EngineAdapter.replay``), so it holds the state as of this step, bit for bit where the update is
  shard-invariant (liver/engine/shard_invariance.py).

Once every slice is mirrored, the switch moves the rest and adopts the mirrors. A mirror dropped
(the handoff abandoned, a deadline before it was complete) costs nothing more: the switch then
streams everything.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from liver.engine.interface import Replay, Update
from liver.planner.plan import Plan
from liver.resource_view.spec import TensorSpec
from liver.transfer.executor import StreamingExecutor
from liver.transfer.precopy import Precopy
from liver.world.group import Group


class Mirror:
    def __init__(self, precopy: Precopy, slices: list[StreamingExecutor], grads: list[StreamingExecutor],
                 storage: dict[str, torch.Tensor], group: Group, replay: Replay) -> None:
        self.precopy = precopy
        self._slices, self._grads = slices, grads
        self.storage = storage  # this process's mirrored shards, by state name (new layout)
        self._grad_buf: dict[str, torch.Tensor] = {}
        self.group = group
        self._replay = replay
        self.started = 0   # slices whose copy began
        self.current = 0   # slices that hold the state as of the last step
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.stats: dict[str, Any] = {**precopy.summary(), "bytes_precopied": 0, "copy_s": 0.0,
                                      "copy_wait_s": 0.0, "mirrored_steps": 0, "grad_bytes": 0,
                                      "replay_s": 0.0, "mirror_bytes": sum(t.numel() * t.element_size()
                                                                           for t in storage.values())}

    @classmethod
    def make(cls, precopy: Precopy, plan: Plan, specs: list[TensorSpec], proc: int, group: Group,
             budget_bytes: int, device: torch.device, replay: Replay,
             pause: Callable[[], None] | None = None,
             storage: dict[str, torch.Tensor] | None = None) -> "Mirror":
        """``storage``: the new engine's, made in Prepare (``Prebuilt.storage``): a mirrored shard
        of its shape and dtype is kept there, so the switch adopts it as it is."""
        params = [s for s in specs if s.kind == "param"]
        slices, grads = [], []
        for i in range(len(precopy.slices)):
            sel = precopy.in_slice(i)
            slices.append(StreamingExecutor(plan, specs, proc, group, budget_bytes, device, pause=pause, select=sel))
            grads.append(StreamingExecutor(plan, params, proc, group, budget_bytes, device, pause=pause, select=sel))
        shapes: dict[str, tuple] = {}
        for ex in slices:
            shapes.update(ex.new_shapes())
        made = storage or {}
        own = {}
        for n, (shape, dtype) in shapes.items():
            t = made.get(n)
            if t is not None and tuple(t.shape) == tuple(shape) and t.dtype == dtype and t.device == device:
                own[n] = t
            else:  # written now, so that a host's pages are faulted in beside training, not in a slice's copy
                own[n] = torch.zeros(shape, dtype=dtype, device=device)
        return cls(precopy, slices, grads, own, group, replay)

    @property
    def num_slices(self) -> int:
        return len(self._slices)

    @property
    def complete(self) -> bool:
        return self.current == len(self._slices)

    def start_next(self, state: dict[str, torch.Tensor]) -> None:
        """At a boundary: copy the next slice of the old engine's ``state`` into the mirror, beside
        the next step's forward and backward."""
        i = self.started
        self.started += 1

        def copy() -> None:
            try:
                t0 = time.perf_counter()
                _, st = self._slices[i].run(state, release=False, into=self.storage)
                self.stats["bytes_precopied"] += st.bytes_received + st.bytes_local  # (what lands in mirrors)
                self.stats["copy_s"] += time.perf_counter() - t0
            except BaseException as e:  # (raised in the training thread, at the update it precedes)
                self._error = e

        self._thread = threading.Thread(target=copy, name=f"precopy-slice{i}", daemon=True)
        self._thread.start()

    def before_update(self) -> None:
        """The engine is about to change its state: the slice being copied must be done."""
        if self._thread is None:
            return
        t0 = time.perf_counter()
        self._thread.join()
        self.stats["copy_wait_s"] += time.perf_counter() - t0
        self._thread = None
        if self._error is not None:
            raise RuntimeError(f"pre-copy of slice {self.started - 1} failed: {self._error!r}") from self._error
        self.current = self.started  # it holds the state before this step's update

    @torch.no_grad()
    def after_update(self, grads: dict[str, torch.Tensor], update: Update) -> None:
        """The step's update, replayed on every slice mirrored so far."""
        t0 = time.perf_counter()
        for ex in self._grads[:self.current]:
            got, st = ex.run(grads, release=False, into=self._grad_buf)
            for n, g in got.items():
                self._grad_buf.setdefault(n, g)
            self.stats["grad_bytes"] += st.bytes_sent + st.bytes_received
            if got:
                self._replay(self.storage, got, update)
        self.stats["mirrored_steps"] += 1
        self.stats["replay_s"] += time.perf_counter() - t0

    def drop(self) -> None:
        """Abandoned: a copy in flight is waited for (its peers drop theirs at the same boundary),
        the group let go of."""
        if self._thread is not None:
            self._thread.join(timeout=30.0)
            self._thread = None
        self.storage = {}
        self._grad_buf = {}
        threading.Thread(target=self.group.destroy, daemon=True).start()

    def abort(self) -> None:
        """The Active World broke under it: a copy blocked on a lost peer ends."""
        self.group.abort()
