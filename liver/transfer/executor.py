"""Streaming executor: runs a transfer plan over point-to-point send/recv, layer by layer, through
a staging budget of B bytes per process.

Every process walks the same global order of slices (layer, task, tensor) and posts only its own,
so each pair of peers sees its messages in one order and the oldest unfinished message can always
complete: there is no barrier between layers. Within a layer, the slices for one peer are packed
back to back into staging messages of at most B/2 bytes, split evenly (a few large messages
instead of one per tensor: the host's per-message cost, not the link, bounds many small
messages); a pack of a single contiguous slice goes from, or into, the shard storage itself, and
a slice larger than B/2 is sent in row chunks. Messages are posted as soon as half the budget is
staged, so one message is packed (or unpacked) while the other is on the link. When the staging
in flight would exceed B, the process waits for its oldest operations first. A layer's local
copies are launched together after its messages are posted: they overlap the link.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

from liver.host import faults
from liver.planner.plan import Plan, TransferTask
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import box_of
from liver.resource_view.view import local_shape
from liver.transfer.staging import StagingRing
from liver.world.group import Group

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "int64": torch.int64, "uint8": torch.uint8}


@dataclass
class TransferStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_local: int = 0
    bytes_kept: int = 0
    bytes_kept_copied: int = 0  # kept shards copied into the new engine's own storage (not adopted)
    seconds: float = 0.0
    host_seconds: float = 0.0  # until everything was launched, before the wait for the device
    peak_staging_bytes: int = 0
    num_chunks: int = 0
    peak_state_bytes: int = 0  # old + new shards alive at once, at layer ends (release=True)
    timeline: list[tuple[int, float]] = field(default_factory=list)  # (layer, seconds at its end)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "timeline"}


def _slices(box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _aligned(nbytes: int) -> int:
    """Pack offsets stay 16-byte aligned, so every slice can be viewed in its own dtype."""
    return (nbytes + 15) // 16 * 16


def _row_chunks(box, row_bytes: int, budget: int, message_bytes: int | None = None) -> list:
    """Split a box along its first dimension into pieces of at most ``message_bytes`` bytes
    (``budget`` when a row does not fit in a message)."""
    (lo, hi), rest = box[0], box[1:]
    if row_bytes > budget:
        raise ValueError(f"staging budget={budget} bytes is smaller than one row of a transfer "
                         f"({row_bytes} bytes); allowed: budget >= the largest row")
    cap = message_bytes if message_bytes and row_bytes <= message_bytes else budget
    rows = hi - lo
    n = -(-rows * row_bytes // cap)  # as few pieces as the cap allows, of even size
    step = -(-rows // n)
    return [((a, min(hi, a + step)),) + rest for a in range(lo, hi, step)]


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy ``src[i]`` into ``dst[i]`` with few launches: the pairs that are both contiguous in one
    multi-tensor kernel (one strided pair in the list would send every pair down the one-kernel-
    per-copy path), the strided ones (column blocks) one by one."""
    groups: tuple[tuple[list, list], tuple[list, list]] = (([], []), ([], []))  # contiguous, strided
    for d, s in zip(dst, src):
        g = groups[0] if d.is_contiguous() and s.is_contiguous() else groups[1]
        g[0].append(d)
        g[1].append(s)
    for d, s in groups:
        if d:
            torch._foreach_copy_(d, s)


def _even_packs(sizes: list[int], cap: int) -> list[int]:
    """Where packs start, for slices of ``sizes`` (aligned bytes, each <= cap) in order: packs of
    at most ``cap`` bytes, about as many as needed and of about even size."""
    target = -(-sum(sizes) // max(1, -(-sum(sizes) // cap)))
    starts, filled = [], cap
    for i, nb in enumerate(sizes):
        if filled >= target or filled + nb > cap:
            starts.append(i)
            filled = 0
        filled += nb
    return starts


class _Message(NamedTuple):
    """One message of a layer, worked out before the switch: a pack of whole slices for (or from)
    one peer, or one slice too large for a message, in row chunks."""

    sending: bool
    proc: int  # the peer process
    slices: tuple  # pack: ((tensor name, index, offset in the pack), ...); rows: ((name, index),)
    nbytes: int  # pack: staging bytes (aligned); rows: the largest chunk
    chunks: tuple = ()  # rows: the index of each chunk


class _Step(NamedTuple):
    """What one process does for one layer."""

    layer: int
    keeps: tuple[str, ...]  # new shard is the old one: nothing moves
    copies: tuple  # ((name, destination index, source index), ...): local copies
    messages: tuple[_Message, ...]  # in the order of their first slice: the same on both peers
    used: frozenset  # old shards read by this layer (dropped one layer later with release=True)


class StreamingExecutor:
    """One process's side of a plan. ``group`` spans every process of the plan; its members are
    the plan's process ids. The walk over the plan (which slice goes in which message) is done
    here, when the executor is made, so a caller can make it before the switch: the switch then
    only launches copies and messages."""

    def __init__(self, plan: Plan, specs: list[TensorSpec], proc: int, group: Group,
                 budget_bytes: int, device: torch.device, message_bytes: int | None = None,
                 pause: Callable[[], None] | None = None,
                 select: Callable[[TransferTask], bool] | None = None) -> None:
        """``select``: only the plan's tasks it accepts (a pre-copy's slices and what it leaves to the
        switch, liver/transfer/precopy.py); the tensors of ``specs`` only (a task's other tensors
        are skipped: the gradients of a task's parameter, without its moments)."""
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes={budget_bytes}: must be positive")
        if message_bytes is not None and not 1 <= message_bytes <= budget_bytes:
            raise ValueError(f"message_bytes={message_bytes}: allowed 1 to budget_bytes={budget_bytes}")
        self.plan = plan
        self.specs = {s.name: s for s in specs}
        self._select = select
        self.proc = proc
        self.group = group
        self.budget = budget_bytes
        # default: two messages in flight, one packed while the other is on the link
        self.message_bytes = message_bytes or max(1, budget_bytes // 2)
        self.device = device
        self.new_rank = plan.placement.index(proc) if proc in plan.placement else None
        self._peer = {p: i for i, p in enumerate(group.members)}  # process -> group rank
        self._shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}  # new shards' shape, dtype
        self._bytes = TransferStats()
        self._steps = []
        for layer, tasks in plan.iter_layer_tasks(proc):  # ``pause``: a companion's pace, between layers
            if pause is not None:
                pause()
            self._steps.append(self._step(layer, tasks))
        staged = sum(_aligned(m.nbytes) * max(1, len(m.chunks)) for st in self._steps for m in st.messages)
        self.staging_bytes = min(self.budget, staged)  # the ring: B, or less if the plan needs less
        self._ring: StagingRing | None = None

    def reserve(self) -> "StreamingExecutor":
        """Allocate the staging now (before the switch: no allocation on its critical path)."""
        if self._ring is None:
            self._ring = StagingRing(self.staging_bytes, self.device)
        return self

    def kept(self) -> frozenset[str]:
        """The tensors whose shard stays on this process in the same box: nothing moves, and the
        new engine may adopt the old storage (``EngineAdapter.enter``'s ``kept``)."""
        return frozenset(n for step in self._steps for n in step.keeps)

    def kept_of(self, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """Of ``state`` (this process's old engine's, None for a joiner), the tensors ``kept``."""
        return {n: state[n] for n in self.kept() if n in state} if state is not None else {}

    def new_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The shape and dtype of each new shard this process receives or copies into."""
        return dict(self._shapes)

    def _new_shard(self, name: str) -> None:
        if name not in self._shapes:
            spec = self.specs[name]
            self._shapes[name] = (local_shape(box_of(self.plan.new, spec, self.new_rank)), _TORCH_DTYPES[spec.dtype])

    def _step(self, layer: int, tasks: list[TransferTask]) -> _Step:
        keeps, copies, used = [], [], set()
        items: list = []  # this layer's messages, by the position of their first slice
        by_peer: dict = {}  # (sending, peer) -> [(position, name, index, bytes)] in order
        for task in tasks:
            if self._select is not None and not self._select(task):
                continue
            numel = 1
            for lo, hi in task.dst_box:
                numel *= hi - lo
            for name in task.tensors:
                if name not in self.specs:
                    continue
                nbytes = numel * self.specs[name].itemsize
                if task.kind == "keep":
                    keeps.append(name)
                    self._bytes.bytes_kept += nbytes
                    continue
                if task.dst_proc == self.proc:
                    self._new_shard(name)
                if task.kind == "copy":
                    copies.append((name, _slices(task.dst_box), _slices(task.src_box)))
                    self._bytes.bytes_local += nbytes
                    used.add(name)
                    continue
                sending = task.src_proc == self.proc
                if sending:
                    used.add(name)
                    self._bytes.bytes_sent += nbytes
                else:
                    self._bytes.bytes_received += nbytes
                peer = task.dst_proc if sending else task.src_proc
                box = task.src_box if sending else task.dst_box
                if nbytes > self.message_bytes:  # larger than a message: rows in chunks
                    row_bytes = nbytes // max(1, box[0][1] - box[0][0])
                    boxes = _row_chunks(box, row_bytes, self.budget, self.message_bytes)
                    chunk_bytes = max(c[0][1] - c[0][0] for c in boxes) * row_bytes
                    items.append(_Message(sending, peer, ((name, _slices(box)),), chunk_bytes,
                                          tuple(_slices(c) for c in boxes)))
                    continue
                by_peer.setdefault((sending, peer), []).append((len(items), name, _slices(box), nbytes))
                items.append(None)  # a slot: the message this slice opens, if it does
        # both peers of a pair see the same slices in the same order: the same packs
        for (sending, peer), slices in by_peer.items():
            starts = _even_packs([_aligned(x[3]) for x in slices], self.message_bytes)
            for i, j in zip(starts, starts[1:] + [len(slices)]):
                packed, o = [], 0
                for _, name, index, nbytes in slices[i:j]:
                    packed.append((name, index, o))
                    o += _aligned(nbytes)
                items[slices[i][0]] = _Message(sending, peer, tuple(packed), o)
        return _Step(layer, tuple(keeps), tuple(copies), tuple(m for m in items if m is not None), frozenset(used))

    @torch.no_grad()
    def run(self, src_state: dict[str, torch.Tensor] | None, release: bool = False,
            into: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], TransferStats]:
        """Move the state. ``src_state`` is this process's old shards (None for a joiner).
        Returns the new shards of this process (empty if it leaves) and statistics.

        ``release``: the old shards are not needed afterwards; each layer's are dropped from
        ``src_state`` as soon as its operations completed (one layer later), so old and new state
        coexist only for about two layers: the extra memory stays bounded, whatever the model size.
        ``into``: storage already allocated in the new layout (a joiner's warm-up state, or the
        new engine's own) to write into, instead of allocating it during the switch; a kept shard
        is copied into it.
        """
        stats = TransferStats(**{k: getattr(self._bytes, k) for k in
                                 ("bytes_sent", "bytes_received", "bytes_local", "bytes_kept")})
        t0 = time.perf_counter()
        dst: dict[str, torch.Tensor] = {}
        self._pending: deque = deque()  # (layer, works, staging regions, buffers, finalizes)
        self.reserve()
        self._taken = 0  # staging regions taken by the operations not posted yet
        self._layer = -2
        self._batch: list = []  # posted together: (is_send, buffer, peer, staging, finalize)
        held: deque = deque()  # (layer, names of old shards it used)
        live = sum(_nbytes(t) for t in src_state.values()) if release else 0  # old + new state bytes

        def dst_tensor(name: str) -> torch.Tensor:
            nonlocal live
            t = dst.get(name)
            if t is None:
                shape, dtype = self._shapes[name]
                t = (into or {}).get(name)
                if t is None or tuple(t.shape) != shape or t.dtype != dtype or t.device != self.device:
                    t = torch.empty(shape, dtype=dtype, device=self.device)
                dst[name] = t
                live += _nbytes(t)
            return t

        def drop(names) -> None:
            """Release old shards that are not also the new ones (kept in place)."""
            nonlocal live
            for n in names:
                t = src_state.get(n)
                if t is not None and dst.get(n) is not t:
                    del src_state[n]
                    live -= _nbytes(t)

        for seq, step in enumerate(self._steps):
            self._layer = seq  # position in this process's order of layers
            for name in step.keeps:
                if into is not None and name in into:
                    old, own = src_state[name], into[name]
                    if own.data_ptr() != old.data_ptr() or own.stride() != old.stride():
                        own.copy_(old)  # the new engine's own storage: a local copy
                        stats.bytes_kept_copied += _nbytes(own)
                    dst[name] = own  # (else it adopted the old storage: nothing to do)
                else:
                    dst[name] = src_state[name]  # the very same storage: nothing moves
            for m in step.messages:  # in the order of each message's first slice
                base = (lambda n: src_state[n]) if m.sending else dst_tensor
                if m.chunks:
                    name, _ = m.slices[0]
                    self._stream(m, base(name), stats)
                else:
                    self._pack(m, [base(n)[index] for n, index, _ in m.slices], stats)
            self._flush()  # the layer's last messages go out; no barrier between layers
            faults.at("transfer", self.proc, seq)  # (the fault matrix's peer lost mid-stream; unset: a no-op)
            faults.at("slow-transfer", self.proc, seq)
            if step.copies:  # after the messages: the copies overlap the link
                _copy_all([dst_tensor(n)[d] for n, d, _ in step.copies],
                          [src_state[n][s] for n, _, s in step.copies])
            if release:
                held.append((seq, step.used))
                while len(held) > 1:  # the layer before this one: wait for it, then drop it
                    done_layer, names = held.popleft()
                    self._drain_layers_upto(done_layer)
                    drop(names)
                stats.peak_state_bytes = max(stats.peak_state_bytes, live)
            stats.timeline.append((step.layer, time.perf_counter() - t0))
        self._flush()
        while self._pending:
            self._complete_oldest()
        self._ring = None  # the staging goes back with the switch
        if release:
            for _, names in held:
                drop(names)
        stats.host_seconds = time.perf_counter() - t0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.seconds = time.perf_counter() - t0
        return dst, stats

    def _pack(self, m: _Message, views: list[torch.Tensor], stats: TransferStats) -> None:
        """Slices for (or from) one peer travel as one message: packed back to back into a staging
        buffer (one copy launch on each side), or from the storage itself when the pack is one
        contiguous slice. Both peers walk the same slices in the same order: same packs."""
        peer, sending = self._peer[m.proc], m.sending
        stats.num_chunks += 1
        if len(views) == 1 and views[0].is_contiguous():
            self._batch.append((sending, views[0], peer, 0, None))
            return
        n = m.nbytes
        flat = self._take(n, stats)
        pieces = [flat[o:o + _nbytes(v)].view(v.dtype).view(v.shape) for v, (_, _, o) in zip(views, m.slices)]
        if sending:
            _copy_all(pieces, views)
            self._batch.append((True, flat, peer, n, None))
        else:
            self._batch.append((False, flat, peer, n, lambda d=views, p=pieces: _copy_all(d, p)))
        self._post_if_half_staged()

    def _take(self, nbytes: int, stats: TransferStats) -> torch.Tensor:
        """Staging from the ring; when it is full, post what is collected and wait for the oldest
        operations until the region fits."""
        buf = self._ring.take(nbytes)
        while buf is None:
            self._flush()
            self._complete_oldest()
            buf = self._ring.take(nbytes)
        self._taken += 1
        stats.peak_staging_bytes = max(stats.peak_staging_bytes, self._ring.in_use)
        return buf

    def _post_if_half_staged(self) -> None:
        """Post what is collected once it stages half the budget: it goes on the link while the
        next message is packed."""
        if sum(x[3] for x in self._batch) >= self.message_bytes:
            self._flush()

    def _flush(self) -> None:
        """Post the collected operations (one coalesced call on NCCL)."""
        if not self._batch:
            return
        sends = [(b, p) for is_send, b, p, _, _ in self._batch if is_send]
        recvs = [(b, p) for is_send, b, p, _, _ in self._batch if not is_send]
        works = self.group.post(sends, recvs)
        self._pending.append((self._layer, works, self._taken, [x[1] for x in self._batch],
                              [x[4] for x in self._batch if x[4] is not None]))
        self._batch, self._taken = [], 0

    def _drain_layers_upto(self, layer: int) -> None:
        while self._pending and self._pending[0][0] <= layer:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        _layer, works, regions, _bufs, finalizes = self._pending.popleft()
        for w in works:
            w.wait()
        for f in finalizes:
            f()
        self._ring.give_back(regions)

    def _stream(self, m: _Message, base: torch.Tensor, stats: TransferStats) -> None:
        """A slice larger than a message, in row chunks."""
        peer = self._peer[m.proc]
        for chunk in m.chunks:
            v = base[chunk]
            nbytes = _nbytes(v)
            staged = 0 if v.is_contiguous() else nbytes
            if not staged:
                self._batch.append((m.sending, v, peer, 0, None))
            else:
                buf = self._take(nbytes, stats).view(v.dtype).view(v.shape)
                if m.sending:
                    buf.copy_(v)
                    self._batch.append((True, buf, peer, staged, None))
                else:
                    self._batch.append((False, buf, peer, staged, lambda d=v, b=buf: d.copy_(b)))
            stats.num_chunks += 1
            self._post_if_half_staged()
