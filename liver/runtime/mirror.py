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

A cold joiner follows the same steps without training (``follow``): old rank 0 tells it, on the
mirror's group, when a slice is copied (``SLICE``), each step's update (``STEP``: its scalars, then
the gradients come from their owners as to every mirror) and, at the switch, whether the mirrors
are used (``SWITCH``). Every process of the handoff makes its mirror in Prepare and they agree on
its slices over the group (``Mirror.agree``): where one cannot (its engine cannot replay, its
copies do not fit), nobody mirrors.

Once every slice is mirrored, the switch moves the rest and adopts the mirrors. A mirror dropped
(the handoff abandoned, a deadline before it was complete) costs nothing more: the switch then
streams everything.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

import torch

from liver.engine.interface import Replay, Update
from liver.host import faults
from liver.planner.plan import Plan
from liver.resource_view.spec import TensorSpec
from liver.transfer.executor import StreamingExecutor
from liver.transfer.precopy import Precopy
from liver.world.group import Group


SLICE, STEP, SWITCH = 1, 2, 3  # what old rank 0 tells a cold joiner that follows
ASK_EVERY_S = 0.2  # a follower asks whether its generation was withdrawn (a store round trip) at most this often


class Mirror:
    def __init__(self, precopy: Precopy, slices: list[StreamingExecutor], grads: list[StreamingExecutor],
                 storage: dict[str, torch.Tensor], group: Group, replay: Replay, leader: int = 0,
                 followers: tuple[int, ...] = ()) -> None:
        """``leader``: the group rank of old rank 0's process; ``followers``: the group ranks of cold
        joiners that follow the steps."""
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
        self.leader, self.followers = leader, followers
        self.used: bool | None = None  # whether the switch takes the mirrors (decided at the switch)
        self.broken: BaseException | None = None  # a peer lost under it: it stops, training goes on
        # a slice copied beside the next step's forward and backward, in a thread; else at the
        # boundary itself (NCCL: operations on two communicators at once may deadlock, as for
        # ``PrepareConfig.connect``)
        self.overlap = True
        self.on_broken: Callable[[BaseException], None] | None = None
        self.stats: dict[str, Any] = {**precopy.summary(), "bytes_precopied": 0, "copy_s": 0.0,
                                      "copy_wait_s": 0.0, "mirrored_steps": 0, "grad_bytes": 0,
                                      "replay_s": 0.0, "mirror_bytes": sum(t.numel() * t.element_size()
                                                                           for t in storage.values())}

    @classmethod
    def make(cls, precopy: Precopy, plan: Plan, specs: list[TensorSpec], proc: int, group: Group,
             budget_bytes: int, device: torch.device, replay: Replay,
             pause: Callable[[], None] | None = None,
             storage: dict[str, torch.Tensor] | None = None, leader: int = 0,
             followers: tuple[int, ...] = ()) -> "Mirror":
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
        return cls(precopy, slices, grads, own, group, replay, leader, followers)

    @staticmethod
    def agree(store, generation: int, members: list[int], proc: int, slices: int, timeout) -> int:
        """Over the job's store (no collective on the new group beside training): the slices every
        process's mirror has, or 0 where they differ (a process without one: nobody mirrors)."""
        store.set(f"precopy/{generation}/{proc}", str(slices))
        keys = [f"precopy/{generation}/{p}" for p in members]
        store.wait(keys, timeout)
        got = {int(store.get(k)) for k in keys}
        return got.pop() if len(got) == 1 else 0

    # ---- old rank 0 to the cold joiners that follow ------------------------------------------
    def _announce(self, kind: int, payload: dict[str, Any] | None = None) -> None:
        if self.group.rank != self.leader or not self.followers:
            return
        data = json.dumps(payload or {}, default=_plain).encode()
        dev = self.group.device
        head = torch.tensor([kind, len(data)], dtype=torch.int64, device=dev)
        body = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
        for f in self.followers:
            self.group.send(head, f)
            self.group.send(body, f)

    def _break(self, err: BaseException) -> None:
        """A peer lost under it (a process died, its group aborted): the mirror stops here and is
        never used; its group is aborted, so that every peer blocked on it fails at once and stops
        too, and at the next boundary no old rank takes the mirrors. Training goes on: no error
        reaches the engine; a process lost is the controller's to handle, as in any preparation."""
        if self.broken is None:
            self.broken = err
            self.group.abort()
            if self.on_broken is not None:
                self.on_broken(f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")

    def announce_switch(self, use: bool) -> None:
        """At the switch, on every old rank alike: whether it takes the mirrors (all of them are
        current, and every rank said so at the boundary); old rank 0 tells the followers."""
        self.used = use and self.broken is None
        if self.broken is None:
            try:
                self._announce(SWITCH, {"mirrored": self.used})
            except Exception as e:  # (a follower lost: its own death is the controller's to handle)
                self._break(e)

    def follow(self, withdrawn: Callable[[], bool]) -> bool | None:
        """A cold joiner: copy each slice and replay each step's update as old rank 0 says, until
        the switch (returns whether the mirrors are used) or until ``withdrawn()`` (None)."""
        dev = self.group.device
        while True:
            head = torch.zeros(2, dtype=torch.int64, device=dev)
            work = self.group.irecv(head, self.leader)
            got, failed = threading.Event(), []  # (a gloo receive says it is complete only once waited for)

            def wait(w=work, e=got, f=failed) -> None:
                try:
                    w.wait()
                except BaseException as err:  # (old rank 0 is gone: the group's timeout, or its end)
                    f.append(err)
                e.set()

            threading.Thread(target=wait, daemon=True).start()
            while not got.wait(ASK_EVERY_S):
                if withdrawn():
                    return None
            if failed:  # its group broke under it: the switch, if any, streams everything
                self._break(failed[0])
                self.used = False
                return False
            kind, n = (int(x) for x in head.tolist())
            body = torch.empty(n, dtype=torch.uint8, device=dev)
            self.group.recv(body, self.leader)
            payload = json.loads(bytes(body.cpu().numpy()).decode())
            if kind == SLICE:
                faults.here("precopy", 0)
                t0 = time.perf_counter()
                _, st = self._slices[self.started].run(None, release=False, into=self.storage)
                self.stats["bytes_precopied"] += st.bytes_received
                self.stats["copy_s"] += time.perf_counter() - t0
                self.started += 1
                self.current = self.started
            elif kind == STEP:
                self._apply({}, Update(step=payload["step"], lr=payload["lr"], grad_scale=payload["grad_scale"],
                                       groups=tuple(payload["groups"]),
                                       counters=tuple(tuple(c) for c in payload["counters"])))
            elif kind == SWITCH:
                self.used = bool(payload["mirrored"]) and self.complete
                return self.used
            else:
                raise RuntimeError(f"pre-copy: unknown message {kind} from old rank 0")

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
        if self.broken is not None:
            return
        try:
            self._announce(SLICE)
        except Exception as e:
            self._break(e)
            return

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
        if not self.overlap:
            self.before_update()

    def before_update(self) -> None:
        """The engine is about to change its state: the slice being copied must be done."""
        if self._thread is None:
            return
        t0 = time.perf_counter()
        self._thread.join()
        self.stats["copy_wait_s"] += time.perf_counter() - t0
        self._thread = None
        if self._error is not None:
            self._break(self._error)
        elif self.broken is None:
            self.current = self.started  # it holds the state before this step's update

    def after_update(self, grads: dict[str, torch.Tensor], update: Update) -> None:
        """The step's update, replayed on every slice mirrored so far (the followers' too)."""
        if self.broken is not None:
            return
        try:
            self._announce(STEP, {"step": update.step, "lr": update.lr, "grad_scale": update.grad_scale,
                                  "groups": list(update.groups), "counters": [list(c) for c in update.counters]})
            self._apply(grads, update)
        except Exception as e:
            self._break(e)

    @torch.no_grad()
    def _apply(self, grads: dict[str, torch.Tensor], update: Update) -> None:
        faults.here("precopy", self.stats["mirrored_steps"] + 1)  # (the fault matrix's; unset: a no-op)
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


def _plain(v: Any) -> Any:
    """A value of an optimizer's options in JSON: a 0-dim tensor (a learning rate as a tensor) as its number."""
    if isinstance(v, torch.Tensor) and v.dim() == 0:
        return v.item()
    raise TypeError(f"pre-copy: an optimizer option {v!r} cannot be sent to a cold joiner")
