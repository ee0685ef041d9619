"""Process groups that belong to one generation.

A ``Group`` wraps a standalone c10d ``ProcessGroup`` built over a ``PrefixStore`` (fresh prefix per
generation), so it never depends on torch.distributed's process-global default group. All ranks
here are group-local. ``LocalGroup`` is the one-member case: every collective is the identity.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
WAIT_SLICE = timedelta(seconds=1)  # a gloo collective's wait looks this often whether its communicator was cut
CUT = "collective abandoned: its communicator was cut (a peer of the generation was fenced)"


class Done:
    """A completed work handle (for groups whose collectives are local)."""

    def wait(self) -> bool:
        return True


def _wrap(store: dist.Store, rank: int, size: int, be: Any, btype: Any, backend: str, device: torch.device,
          name: str) -> ProcessGroup:
    """A ``ProcessGroup`` over backend ``be`` (on the CPU too, for gloo), named after ``name``."""
    pg = ProcessGroup(store, rank, size)
    pg._set_default_backend(btype)
    pg._register_backend(device, btype, be)
    if device.type != "cpu" and backend == "gloo":
        pg._register_backend(torch.device("cpu"), btype, be)
    if hasattr(pg, "_set_group_name"):
        pg._set_group_name(name.replace("/", "_"))
    return pg


class _Comm:
    """One communicator and the groups that use it: groups of successive generations over the
    same processes in the same order share it (``Group.share``); the last one to let go shuts it."""

    def __init__(self, pg: ProcessGroup, backend: str, device: torch.device) -> None:
        self.pg, self.backend, self.device = pg, backend, device
        self.users = 1
        self._lock = threading.Lock()
        self.cut = threading.Event()  # (``World.interrupt``: a peer fenced; its waits end)
        self.abandoned: Any = None  # a collective a wait gave up on at the cut, gloo still in it

    def take(self) -> None:
        with self._lock:
            if self.users == 0:
                raise RuntimeError(f"communicator {self.pg.group_name!r} was already shut down")
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last and self.backend == "nccl":
            try:
                self.pg._get_backend(self.device).shutdown()
            except Exception:  # already torn down or a peer died
                pass


def arrive(store: dist.Store, name: str, members: list[int], me: int, pause: Callable[[], None],
           timeout: timedelta, slice_s: float = 0.25) -> None:
    """Every one of ``members`` has begun building the groups ``name`` names: a rendezvous of our
    own before Gloo's and NCCL's, whose waits in their constructors no thread can cut short. It
    looks every few milliseconds at first, then every ``slice_s``, calling ``pause`` between looks
    (it raises to stop: a preparation abandoned while a member never comes, its process stopped,
    ends here at once instead of at ``timeout`` in a constructor). TimeoutError naming the missing
    members after ``timeout``. (It looks with ``check``, not a timed ``wait``: torch logs every
    wait that times out, four warnings a second in each rank's log while a joiner boots.)"""
    store.set(f"{name}/arrived/{me}", "1")
    keys = [f"{name}/arrived/{m}" for m in members]
    end = time.monotonic() + timeout.total_seconds()
    nap = 0.005
    while not store.check(keys):
        if time.monotonic() > end:
            missing = [m for m, k in zip(members, keys) if not store.check([k])]
            raise TimeoutError(f"{name}: processes {missing} did not arrive within "
                               f"{timeout.total_seconds():g} s") from None
        pause()
        time.sleep(nap)
        nap = min(2 * nap, slice_s)


_PARKED: list[_Comm] = []
"""Communicators let go of while gloo was still in a collective on them (``Group.abort``)."""
_PARKED_LOCK = threading.Lock()  # (a generation's clean-up thread destroys groups beside the training thread)


def _park(comm: _Comm) -> bool:
    """Keep ``comm`` alive if a collective on it is still running in gloo, and let go of those
    parked before whose collective has ended. Gloo's group, once nothing holds it, waits in its
    destructor for the collectives its threads run: one that the cut did not wake runs to the
    group's timeout, and the thread that let go (the training thread, stalling) with it, so it
    never reported for the heal (about 2 in 80 runs of the fenced-node test). Parked, it ends in
    gloo's threads; its connections are already cut (``World.interrupt``)."""
    with _PARKED_LOCK:
        _sweep()
        if comm.abandoned is None or comm.abandoned.is_completed():
            return False
        if all(c is not comm for c in _PARKED):  # (groups sharing it park it once)
            _PARKED.append(comm)
        return True


def parked() -> int:
    """How many communicators are parked (``_park``), those whose collective has ended let go of."""
    with _PARKED_LOCK:
        _sweep()
        return len(_PARKED)


def _sweep() -> None:
    """(Under ``_PARKED_LOCK``.) Let go of the parked communicators whose collective has ended."""
    _PARKED[:] = [c for c in _PARKED if not c.abandoned.is_completed()]


class Group:
    """A real process group of ``size`` members; this process is member ``rank``.

    ``members`` are the generation-wide ranks of the members, in group-rank order. ``inherited``:
    the communicator is shared with a group of the Active World (training uses it right now).
    """

    def __init__(self, name: str, members: list[int], rank: int, pg: ProcessGroup | None,
                 backend: str, device: torch.device, comm: _Comm | None = None,
                 inherited: bool = False) -> None:
        self.name = name
        self.members = list(members)
        self.rank = rank
        self.size = len(members)
        self.pg = pg
        self.backend = backend
        self.device = device
        if comm is None and pg is not None:
            comm = _Comm(pg, backend, device)
        self.comm = comm
        self.inherited = inherited

    local = False
    """Whether its collectives are answered in this process, on any device (``LocalGroup``)."""

    # ---- construction --------------------------------------------------------------------
    @staticmethod
    def create(store: dist.Store, name: str, members: list[int], my_rank: int, backend: str,
               device: torch.device, timeout: timedelta) -> "Group":
        """Build (rendezvous) the group; blocks until every member has called create()."""
        rank = members.index(my_rank)
        if len(members) == 1:
            return LocalGroup(name, members, 0, backend, device)
        prefix_store = dist.PrefixStore(f"{name}/", store)
        if backend == "gloo":
            be = dist.ProcessGroupGloo(prefix_store, rank, len(members), timeout)
            btype = ProcessGroup.BackendType.GLOO
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            be = dist.ProcessGroupNCCL(prefix_store, rank, len(members), opts)
            btype = ProcessGroup.BackendType.NCCL
        else:
            raise ValueError(f"backend={backend!r}: allowed 'gloo', 'nccl'")
        return Group(name, members, rank, _wrap(prefix_store, rank, len(members), be, btype, backend, device, name),
                     backend, device)

    @staticmethod
    def solo(name: str, members: list[int], backend: str, device: torch.device) -> "Group":
        """A real one-member group (no peer, no rendezvous): where a communicator object is needed
        for an axis of size one (a DeviceMesh dimension), instead of a ``LocalGroup``."""
        store = dist.HashStore()
        if backend == "nccl":
            be, btype = dist.ProcessGroupNCCL(store, 0, 1), ProcessGroup.BackendType.NCCL
        else:
            be, btype = dist.ProcessGroupGloo(store, 0, 1), ProcessGroup.BackendType.GLOO
        return Group(name, members, 0, _wrap(store, 0, 1, be, btype, backend, device, name), backend, device)

    def share(self, name: str, members: list[int], inherited: bool) -> "Group":
        """The same communicator under another role or generation: ``members`` (that generation's
        ranks) must belong to the same processes in the same order, so group ranks are unchanged."""
        if self.comm is None or len(members) != self.size:
            raise ValueError(f"{self} cannot be shared as {name} with members {members}")
        self.comm.take()
        return Group(name, members, self.rank, self.pg, self.backend, self.device, self.comm, inherited)

    def init_comm(self) -> None:
        """Create the communicator now, with no collective: on NCCL the ncclCommInitRank that the
        first collective would otherwise run (every member must call it; the GIL is released while
        it waits); its connections are still made by the first collective. Gloo connected when
        the group was built."""
        if self.backend == "nccl" and self.comm is not None and self.pg is not None:
            backend = self.pg._get_backend(self.device)
            if hasattr(backend, "eager_connect_single_device"):
                backend.eager_connect_single_device(self.device)

    def usable_from(self, training_thread: bool) -> bool:
        """A communicator shared with the Active World is used by the training thread only."""
        return training_thread or not self.inherited

    # ---- collectives (in place) ----------------------------------------------------------
    def wait(self, work: Any) -> None:
        """Until a collective's ``work`` is done. On gloo in slices of ``WAIT_SLICE``, so that a communicator cut
        from another thread (``World.interrupt``: a peer fenced) ends the wait with an error the
        loop takes for a broken group (``CUT``; ``world.broken``), even where cutting the sockets
        did not wake gloo: in about 2 of 80 runs of the fenced-node test, a survivor's all-reduce
        stayed blocked after its connections were cut, and the heal waited for it in vain."""
        # (``work`` is dropped before any error leaves: the error's traceback keeps this frame, and
        # a handle kept alive keeps the communicator and its connections, which ``World.abort``
        # closes so that the peers blocked on this rank wake: with the handle kept, a survivor
        # waited on its stalled peer for the whole heal timeout)
        if self.backend != "gloo" or self.comm is None:
            return self._wait_whole(work)
        while True:
            try:
                work.wait(WAIT_SLICE)
                return
            except RuntimeError:
                pass
            if work.is_completed():  # (it failed, or ended as the slice did: its own outcome)
                try:
                    work.wait()
                    return
                except RuntimeError as e:
                    failed = e
                del work
                raise failed
            if self.comm.cut.is_set():
                self.comm.abandoned = work  # (kept by the communicator, not by this frame: ``_park``)
                del work
                raise RuntimeError(CUT) from None

    def allreduce(self, t: torch.Tensor, op: str = "sum") -> None:
        if self.size == 1:  # (itself: no launch, no wait)
            return
        opts = dist.AllreduceOptions()
        opts.reduceOp = _OPS[op]
        self.wait(self.pg.allreduce([t], opts))

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self.wait(self.pg.broadcast([t], opts))

    def allgather(self, t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(self.size)]
        self.wait(self.pg.allgather([out], [t]))
        return out

    def isend(self, t: torch.Tensor, dst: int, tag: int = 0) -> Any:
        return self.pg.send([t], dst, tag)

    def irecv(self, t: torch.Tensor, src: int, tag: int = 0) -> Any:
        return self.pg.recv([t], src, tag)

    @staticmethod
    def _wait_whole(work: Any) -> None:
        """Until ``work`` is done, in one wait: on NCCL, and a point-to-point operation's on gloo. A
        timed wait on a gloo send or receive that expires closes its pair ("Application timeout caused
        pair closure"; the peer's next operation: "Connection closed by peer"): sliced, a receive
        that waited more than a slice for its peer broke the generation (a pipeline stage behind a
        slow one). A cut peer's sockets end it."""
        try:
            work.wait()
        except BaseException:
            del work
            raise

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._wait_whole(self.isend(t, dst, tag))

    def recv(self, t: torch.Tensor, src: int, tag: int = 0) -> None:
        self._wait_whole(self.irecv(t, src, tag))

    def exchange(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                 tag: int = 0) -> None:
        """Post point-to-point sends and receives together and wait for all of them.

        On NCCL they are coalesced into one group call, so two peers that both send before they
        receive cannot deadlock on in-order streams.
        """
        for w in self.post(sends, recvs, tag):
            self._wait_whole(w)

    def post(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
             tag: int = 0) -> list[Any]:
        """Post point-to-point operations without waiting; on NCCL as one coalesced group call
        (several channels at once instead of one operation after another)."""
        if not sends and not recvs:
            return []
        coalesce = self.backend == "nccl"
        if coalesce:
            self.pg._start_coalescing(self.device)
        works = [self.pg.send([t], p, tag) for t, p in sends]
        works += [self.pg.recv([t], p, tag) for t, p in recvs]
        if coalesce:
            work = self.pg._end_coalescing(self.device)
            works = [work] if work is not None else works
        return works

    def barrier(self) -> None:
        self.allreduce(torch.zeros(1, device=self.device))

    def _all_gather_bytes(self, blob: bytes) -> list[bytes]:
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.int64, device=self.device)
        sizes = [int(x.item()) for x in self.allgather(n)]
        buf = torch.zeros(max(sizes), dtype=torch.uint8, device=self.device)
        buf[: data.numel()] = data.to(self.device)
        return [bytes(b[:s].cpu().numpy()) for b, s in zip(self.allgather(buf), sizes)]

    def all_gather_json(self, obj: Any) -> list[Any]:
        """Every member's plain data, in group-rank order (JSON: nothing read from a peer runs code;
        tuples come back as lists)."""
        return [json.loads(b) for b in self._all_gather_bytes(json.dumps(obj).encode())]

    def broadcast_json(self, obj: Any, src: int = 0) -> Any:
        """Member ``src``'s plain data (JSON: nothing read runs code), to every member."""
        return self.all_gather_json(obj if self.rank == src else None)[src]

    def connect(self) -> None:
        """First collective: connection set-up happens here, not at the first training step."""
        self.barrier()

    def connect_p2p(self, send_to: list[int], recv_from: list[int]) -> None:
        """Point-to-point connections are set up lazily per pair (NCCL): make them now, for the
        pairs that will be used, with one small message each way (group ranks)."""
        sends = [(torch.ones(1, device=self.device), p) for p in sorted(set(send_to)) if p != self.rank]
        recvs = [(torch.empty(1, device=self.device), p) for p in sorted(set(recv_from)) if p != self.rank]
        self.exchange(sends, recvs)

    def abort(self) -> None:
        """Break the communicator now and let go of it: its connections close once nothing holds
        it (an abort alone leaves gloo's open), so every peer blocked in a collective on it fails at
        once; a generation that lost a rank must not leave the others waiting on one another."""
        if self.pg is None:
            return
        try:
            backend = self.pg._get_backend(self.device)
            if hasattr(backend, "abort"):
                backend.abort()
        except RuntimeError:  # already broken
            pass
        if self.comm is not None:
            _park(self.comm)
        self.pg = None
        self.comm = None

    def destroy(self) -> None:
        """Let go of the communicator (shut down when no other group shares it)."""
        if self.comm is not None:
            _park(self.comm)
            self.comm.release()
            self.comm = None
        self.pg = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, rank {self.rank}/{self.size})"


def _own_comms(groups: list[Group]):
    """One group per communicator of ``groups`` made for them (not those shared with the Active
    World, whose groups are connected already), in the order given: the same order on every member."""
    seen = set()
    for g in groups:
        if g.comm is not None and not g.inherited and id(g.comm) not in seen:
            seen.add(id(g.comm))
            yield g


def init_once(groups: list[Group]) -> None:
    """``init_comm`` on each communicator of ``groups`` made for them, once."""
    for g in _own_comms(groups):
        g.init_comm()


def connect_once(groups: list[Group]) -> None:
    """A first collective on each communicator of ``groups`` made for them, once."""
    for g in _own_comms(groups):
        g.connect()


class LocalGroup(Group):
    """A group whose collectives are answered locally: the one-member group is exact.

    Its subclass ``MockGroup`` (liver.world.mock) has more nominal members but still answers
    locally; this class keeps the arithmetic identity (sum over one member = the value).
    """

    def __init__(self, name: str, members: list[int], rank: int, backend: str,
                 device: torch.device) -> None:
        super().__init__(name, members, rank, None, backend, device)

    local = True

    def allreduce(self, t: torch.Tensor, op: str = "sum") -> None:
        return None

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        return None

    def allgather(self, t: torch.Tensor) -> list[torch.Tensor]:
        return [t.clone() for _ in range(self.size)]

    def isend(self, t: torch.Tensor, dst: int, tag: int = 0) -> Any:
        if dst != self.rank:
            raise RuntimeError(f"{self}: send to member {dst} of a local group")
        return Done()

    def irecv(self, t: torch.Tensor, src: int, tag: int = 0) -> Any:
        if src != self.rank:
            raise RuntimeError(f"{self}: recv from member {src} of a local group")
        return Done()

    def exchange(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                 tag: int = 0) -> None:
        if sends or recvs:
            raise RuntimeError(f"{self}: point-to-point traffic on a local group")

    def barrier(self) -> None:
        return None

    def connect_p2p(self, send_to: list[int], recv_from: list[int]) -> None:
        return None

    def all_gather_json(self, obj: Any) -> list[Any]:
        return [json.loads(json.dumps(obj)) for _ in range(self.size)]

    def destroy(self) -> None:
        return None
