"""Streaming executor: runs a transfer plan over point-to-point send/recv, layer by layer, through
a staging budget of B bytes per process.

Every process walks the same global order of slices (layer, task, tensor) and posts only its own,
so each pair of peers sees its messages in one order and the oldest unfinished message can always
complete: there is no barrier between layers. Within a layer, the slices for one peer are packed
back to back into staging buffers of at most B bytes (a few large messages instead of one per
tensor: the host's per-message cost, not the link, bounds many small messages); a pack of a single
contiguous slice goes from, or into, the shard storage itself, and a slice larger than B is sent in
row chunks. When the staging in flight would exceed B, the process waits for its oldest
operations first.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from liver.planner.plan import Plan, TransferTask
from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import local_shape, view
from liver.world.group import Group

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class TransferStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_local: int = 0
    bytes_kept: int = 0
    seconds: float = 0.0
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


def _row_chunks(box, row_bytes: int, budget: int) -> list:
    """Split a box along its first dimension into pieces of at most ``budget`` bytes."""
    (lo, hi), rest = box[0], box[1:]
    if row_bytes > budget:
        raise ValueError(f"staging budget={budget} bytes is smaller than one row of a transfer "
                         f"({row_bytes} bytes); allowed: budget >= the largest row")
    step = max(1, budget // row_bytes)
    return [((a, min(hi, a + step)),) + rest for a in range(lo, hi, step)]


class StreamingExecutor:
    """One process's side of a plan. ``group`` spans every process of the plan; its members are
    the plan's process ids."""

    def __init__(self, plan: Plan, specs: list[TensorSpec], proc: int, group: Group,
                 budget_bytes: int, device: torch.device) -> None:
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes={budget_bytes}: must be positive")
        self.plan = plan
        self.specs = {s.name: s for s in specs}
        self.proc = proc
        self.group = group
        self.budget = budget_bytes
        self.device = device
        self.new_rank = plan.placement.index(proc) if proc in plan.placement else None
        self._peer = {p: i for i, p in enumerate(group.members)}  # process -> group rank

    @torch.no_grad()
    def run(self, src_state: dict[str, torch.Tensor] | None, release: bool = False,
            into: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], TransferStats]:
        """Move the state. ``src_state`` is this process's old shards (None for a joiner).
        Returns the new shards of this process (empty if it leaves) and statistics.

        ``release``: the old shards are not needed afterwards; each layer's are dropped from
        ``src_state`` as soon as its operations completed (one layer later), so old and new state
        coexist only for about two layers: the extra memory stays bounded, whatever the model size.
        ``into``: storage already allocated in the new layout (a joiner's warm-up state) to write
        into, instead of allocating it during the switch.
        """
        stats = TransferStats()
        t0 = time.perf_counter()
        dst: dict[str, torch.Tensor] = {}
        self._pending: deque = deque()  # (layer, works, staging bytes, buffers, finalizes)
        self._staging = 0
        self._layer = -2
        self._batch: list = []  # posted together: (is_send, buffer, peer, staging, finalize)
        held: deque = deque()  # (layer, names of old shards it used)
        live = sum(_nbytes(t) for t in src_state.values()) if release else 0  # old + new state bytes

        def dst_tensor(name: str) -> torch.Tensor:
            nonlocal live
            t = dst.get(name)
            if t is None:
                spec = self.specs[name]
                shape = local_shape(view(spec, self.plan.new, self.new_rank))
                dtype = _TORCH_DTYPES[spec.dtype]
                t = (into or {}).get(name)
                if t is None or tuple(t.shape) != shape or t.dtype != dtype or t.device != self.device:
                    t = torch.empty(shape, dtype=dtype, device=self.device)
                dst[name] = t
                live += _nbytes(t)
            return t

        def drop(names: set[str]) -> None:
            """Release old shards that are not also the new ones (kept in place)."""
            nonlocal live
            for n in names:
                t = src_state.get(n)
                if t is not None and dst.get(n) is not t:
                    del src_state[n]
                    live -= _nbytes(t)

        for seq, (layer, tasks) in enumerate(self.plan.layer_tasks(self.proc)):
            self._layer = seq  # position in this process's order of layers
            used: set[str] = set()
            items: list = []  # messages of this layer, by the position of their first slice
            open_packs: dict = {}  # (sending, peer) -> [slices, bytes] of the pack being filled
            for task in tasks:
                kind = task.kind
                for name in task.tensors:
                    if kind == "keep":
                        dst[name] = src_state[name]  # the very same storage: nothing moves
                        stats.bytes_kept += _nbytes(src_state[name])
                    elif kind == "copy":
                        d = dst_tensor(name)[_slices(task.dst_box)]
                        d.copy_(src_state[name][_slices(task.src_box)])
                        stats.bytes_local += _nbytes(d)
                        used.add(name)
                    else:
                        sending = task.src_proc == self.proc
                        if sending:
                            used.add(name)
                        v = (src_state[name][_slices(task.src_box)] if sending
                             else dst_tensor(name)[_slices(task.dst_box)])
                        nbytes = _nbytes(v)
                        if sending:
                            stats.bytes_sent += nbytes
                        else:
                            stats.bytes_received += nbytes
                        if nbytes > self.budget:  # larger than a whole pack: rows in chunks
                            items.append((len(items), "rows", (task, name)))
                            continue
                        key = (sending, task.dst_proc if sending else task.src_proc)
                        pack = open_packs.get(key)
                        if pack is None or pack[1] + _aligned(nbytes) > self.budget:
                            pack = open_packs[key] = [[], 0]
                            items.append((len(items), "pack", (key, pack[0])))
                        pack[0].append(v)
                        pack[1] += _aligned(nbytes)
            # in the order of each message's first slice: the same order on both peers of a pair
            for _, what, args in items:
                if what == "pack":
                    (sending, proc), views = args
                    self._pack(views, proc, sending, stats)
                else:
                    task, name = args
                    self._stream(task, name, src_state, dst_tensor, stats)
            self._flush()  # a layer's operations go out together; no barrier between layers
            if release:
                held.append((seq, used))
                while len(held) > 1:  # the layer before this one: wait for it, then drop it
                    done_layer, names = held.popleft()
                    self._drain_layers_upto(done_layer)
                    drop(names)
                stats.peak_state_bytes = max(stats.peak_state_bytes, live)
            stats.timeline.append((layer, time.perf_counter() - t0))
        self._flush()
        self._drain(0)
        if release:
            for _, names in held:
                drop(names)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.seconds = time.perf_counter() - t0
        return dst, stats

    def _pack(self, pack: list[torch.Tensor], proc: int, sending: bool, stats: TransferStats) -> None:
        """Slices for (or from) one peer travel as one message: packed back to back into a staging
        buffer (one copy launch on each side), or from the storage itself when the pack is one
        contiguous slice. Both peers walk the same slices in the same order: same packs."""
        peer = self._peer[proc]
        stats.num_chunks += 1
        if len(pack) == 1 and pack[0].is_contiguous():
            self._batch.append((sending, pack[0], peer, 0, None))
            return
        n = sum(_aligned(_nbytes(v)) for v in pack)
        if self._staging + n > self.budget:
            self._flush()
            self._drain(n)
        flat = torch.empty(n, dtype=torch.uint8, device=self.device)
        pieces, o = [], 0
        for v in pack:
            nb = _nbytes(v)
            pieces.append(flat[o:o + nb].view(v.dtype).view(v.shape))
            o += _aligned(nb)
        if sending:
            torch._foreach_copy_(pieces, pack)
            self._batch.append((True, flat, peer, n, None))
        else:
            self._batch.append((False, flat, peer, n, lambda d=pack, p=pieces: torch._foreach_copy_(d, p)))
        self._staging += n
        stats.peak_staging_bytes = max(stats.peak_staging_bytes, self._staging)

    def _flush(self) -> None:
        """Post the collected operations (one coalesced call on NCCL)."""
        if not self._batch:
            return
        sends = [(b, p) for is_send, b, p, _, _ in self._batch if is_send]
        recvs = [(b, p) for is_send, b, p, _, _ in self._batch if not is_send]
        works = self.group.post(sends, recvs)
        self._pending.append((self._layer, works, sum(x[3] for x in self._batch), [x[1] for x in self._batch],
                              [x[4] for x in self._batch if x[4] is not None]))
        self._batch = []

    def _drain(self, need: int) -> None:
        """Wait for the oldest operations until ``need`` more staging bytes fit (0: wait for all)."""
        while self._pending and (need == 0 or self._staging + need > self.budget):
            self._complete_oldest()

    def _drain_layers_upto(self, layer: int) -> None:
        while self._pending and self._pending[0][0] <= layer:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        _layer, works, nbytes, _bufs, finalizes = self._pending.popleft()
        for w in works:
            w.wait()
        for f in finalizes:
            f()
        self._staging -= nbytes

    def _stream(self, task: TransferTask, name: str, src_state, dst_tensor,
                stats: TransferStats) -> None:
        """A slice larger than B, in row chunks (bytes are counted by the caller)."""
        spec = self.specs[name]
        sending = task.src_proc == self.proc
        base = src_state[name] if sending else dst_tensor(name)
        box = task.src_box if sending else task.dst_box
        row_bytes = spec.itemsize
        for lo, hi in box[1:]:
            row_bytes *= hi - lo
        for chunk in _row_chunks(box, row_bytes, self.budget):
            v = base[_slices(chunk)]
            nbytes = _nbytes(v)
            extra = 0 if v.is_contiguous() else nbytes
            if extra and self._staging + extra > self.budget:
                self._flush()
                self._drain(extra)
            if sending:
                buf = v if not extra else v.contiguous()
                self._batch.append((True, buf, self._peer[task.dst_proc], extra, None))
            else:
                buf = v if not extra else torch.empty(v.shape, dtype=v.dtype, device=v.device)
                finalize = None if not extra else (lambda d=v, b=buf: d.copy_(b))
                self._batch.append((False, buf, self._peer[task.src_proc], extra, finalize))
            self._staging += extra
            stats.peak_staging_bytes = max(stats.peak_staging_bytes, self._staging)
            stats.num_chunks += 1
