"""Companion: prepares this process's part of the Shadow World while training goes on.

For generation g it reads the transfer plan (made once by the controller), builds the new
generation's groups (if this process holds a new rank) and the transfer group over every process
of both generations, works out its transfer schedule, connects the groups (first collectives,
point-to-point connections), then reports ready. Beside training it keeps to its pace (at most a
share of each step, liver/runtime/pace.py). With connect="background" (gloo's default) all of it runs
beside training; with connect="boundary" (NCCL's default: NCCL operations on two communicators at
once can deadlock) the communicators are created beside training (ncclCommInitRank, which runs no
kernel) and their first collectives and connections run at one iteration boundary on every member
at once. Groups over the same processes as one of the Active World take over its communicator
(liver/world/sharing.py). Old ranks run it in a background thread (with its own store
connection); a joiner runs it in the foreground after its mock warm-up. A cancelled preparation is
abandoned: its groups live under their own store prefix, so they cannot disturb anybody; it stops
at its next pause and lets go of them (a rendezvous it is blocked in ends at the latest at its
timeout).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from liver.host.cores import Binding, available
from liver.engine.interface import EngineAdapter, NotReplayable, Prebuilt, TrainingEngine
from liver.transfer.executor import StreamingExecutor
from liver.transfer.precopy import choose
from liver.planner.plan import Plan
from liver.runtime.mirror import Mirror
from liver.runtime.pace import Pace
from liver.protocol.messages import Failure, GenerationSpec, write
from liver.protocol.store import fetch_plan, put
from liver.topology import JobConfig, Layout
from liver.world.group import Group, arrive, connect_once, init_once
from liver.world.sharing import Sharing
from liver.world.world import World


def layouts(adapter: EngineAdapter, job: JobConfig, spec: GenerationSpec) -> tuple[Layout, Layout]:
    return adapter.layout(job, spec.old_parallel), adapter.layout(job, spec.parallel)


def _describes(view, layout: Layout) -> bool:
    """The plan's view is of ``layout``: the Layout itself, or a box table of its size."""
    return view.parallel == layout.parallel if isinstance(view, Layout) else view.size == layout.size


WITHDRAWN_EVERY_S = 0.2  # a store round trip each time: not at every unit of work


class Abandoned(RuntimeError):
    """Raised inside an abandoned preparation at its next pause: it stops there."""


class Preparation:
    """Everything process ``proc`` needs, before the switch, to enter generation ``spec``."""

    def __init__(self, *, adapter: EngineAdapter, job: JobConfig, spec: GenerationSpec, proc: int, store: dist.Store,
                 backend: str, device: torch.device, timeout_s: float, budget_bytes: int,
                 connect: str = "background", active: World | None = None, pace: Pace | None = None,
                 old: TrainingEngine | None = None, withdrawn: Callable[[], bool] | None = None,
                 precopy: tuple[int, int] | None = None, secret: bytes = b"") -> None:
        """``withdrawn``: asked at pauses (at most every ``WITHDRAWN_EVERY_S``) by a process that has
        no iteration boundary to learn of it (a cold joiner): True stops the preparation as abandoned.
        ``precopy``: (slice bytes, memory cap bytes) where the state that moves between old ranks is
        mirrored before the switch (liver/runtime/mirror.py); None: it all streams at the switch."""
        self.adapter, self.job, self.spec, self.proc, self.store = adapter, job, spec, proc, store
        self.active = active  # this process's Active World (None for a joiner, and in a heal)
        self.old = old  # this process's engine on the old generation (None for a joiner): its kept shards
        # beside training: at most a share of each step (liver/runtime/pace.py); alone: no limit
        self.pace = pace or Pace(0.0)
        self.budget_bytes, self.connect_at = budget_bytes, connect
        self.backend, self.device = backend, device
        self.timeout = timedelta(seconds=timeout_s)
        self.world: World | None = None
        self.transfer: Group | None = None
        self.plan: Plan | None = None
        self.executor: StreamingExecutor | None = None
        self.prebuilt: Prebuilt | None = None  # what of the new engine is made before the switch
        self.precopy = precopy
        self.secret = secret  # the job's: its plan is unpickled only once authenticated
        self.mirror: Mirror | None = None  # the pre-copy's, on every process of the handoff
        self.rest: StreamingExecutor | None = None  # with a mirror: what the switch still moves
        self._sharing: Sharing | None = None
        self.built = False
        self.ready = False
        self.abandoned = False
        self._withdrawn, self._asked = withdrawn, 0.0
        self._release_lock = threading.Lock()
        self.error: BaseException | None = None
        self.timings: dict[str, float] = {}

    @property
    def generation(self) -> int:
        return self.spec.generation

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:
            self._failed(e)
        finally:
            if self.abandoned:
                self.release()

    def _pause(self) -> None:
        """Between units of phase A's work: stop if abandoned, else keep to the pace."""
        if self._withdrawn is not None and time.monotonic() - self._asked > WITHDRAWN_EVERY_S:
            self._asked = time.monotonic()
            self.abandoned = self.abandoned or self._withdrawn()
        if self.abandoned:
            raise Abandoned(f"preparation of generation {self.generation} was abandoned")
        self.pace()

    def release(self) -> None:
        """An abandoned preparation lets go of its groups (communicators it shares with the
        Active World stay theirs) and of its staging. Only from the thread that ran it, or after."""
        with self._release_lock:
            for g in self._sharing.handed if self._sharing else ():  # every group, a cut-short build's too
                g.destroy()
            if self.mirror is not None:
                self.mirror.drop()
            self.world = self.transfer = self.executor = self.prebuilt = self.mirror = self.rest = None

    def _run(self) -> None:
        """Phase A: plan, and build the groups (store rendezvous). Phase B follows at once, or at
        an iteration boundary when ``defer_connect``."""
        t0, c0 = time.perf_counter(), time.thread_time()
        s = self.spec
        old, new = layouts(self.adapter, self.job, s)
        self.plan = fetch_plan(self.store, s.generation, self.secret)  # the controller's, sealed (protocol/store.py)
        old_ok = self.plan.old.size == len(s.old_ranks) if s.old_ranks is not None else _describes(self.plan.old, old)
        if not (old_ok and _describes(self.plan.new, new)
                and (self.plan.placement, self.plan.old_procs) == (list(s.procs), list(s.old_procs))):
            raise RuntimeError(f"plan/{s.generation} in the store does not match gen/{s.generation}")
        self.timings["plan_s"] = time.perf_counter() - t0
        self._pause()
        t1 = time.perf_counter()
        # groups over the same processes as one of the Active World share its communicator
        sharing = self._sharing = Sharing.of_active(self.active, s.old_procs, self._pause) \
            if self.active is not None else Sharing(self._pause)
        members = sorted(set(s.old_procs) | set(s.procs))
        # every member has begun (a withdrawn generation whose joiner was stopped is let go here)
        arrive(self.store, f"liver/gen{s.generation}", members, self.proc, self._pause, self.timeout)
        if self.proc in s.procs:
            self.world = World.build(self.store, s.generation, new, s.procs.index(self.proc),
                                     self.backend, self.device, self.timeout, cpu_groups=True,
                                     procs=s.procs, sharing=sharing)
        self.transfer = sharing.group(self.store, f"liver/gen{s.generation}/transfer", members,
                                      self.proc, self.backend, self.device, self.timeout)
        if self.defer_connect:  # the communicators now, beside training; their connections at the boundary
            init_once([*(self.world.every_group() if self.world else []), self.transfer])
            self.pace.forgive()  # ncclCommInitRank releases the GIL: it takes a spare core, not a step
        self.timings["build_s"] = time.perf_counter() - t1
        self.timings["comms_created"], self.timings["comms_shared"] = sharing.created, sharing.shared
        t2 = time.perf_counter()  # which slice goes in which message, worked out now, not in the switch
        self.executor = StreamingExecutor(self.plan, self.adapter.state_specs(self.job), self.proc, self.transfer,
                                          self.budget_bytes, self.device, pause=self._pause)
        self._pause()
        self.executor.reserve()  # its staging too
        self.timings["schedule_s"] = time.perf_counter() - t2
        if self.world is not None:  # the new engine, as far as it can be made before the pause
            self._pause()
            t3 = time.perf_counter()
            with self.world.registered_here():  # (in this thread only: the training thread keeps its own)
                # the old engine's shards that stay in their box: as the switch will find them (``switch``)
                kept = self.executor.kept_of(self.old.state if self.old is not None else None)
                self.prebuilt = self.adapter.prebuild(self.job, self.world, self.device, kept,
                                                      self.budget_bytes - self.executor.staging_bytes)
            self.timings["prebuild_s"] = time.perf_counter() - t3
            self.timings["prebuilt"] = self.prebuilt.path
            self.timings["prebuilt_bytes"] = self.prebuilt.storage_bytes
            self.timings.update(self.prebuilt.ahead)
        if self.precopy is not None and s.kind != "heal" and (self.active is not None or self.proc not in s.old_procs):
            self._make_mirror()  # (its shards in the new engine's storage where Prepare made it)
        # CPU time of this thread (Python holds the GIL for most of it: the training thread's cost)
        self.timings["build_cpu_s"] = time.thread_time() - c0
        self.timings["paced_steps"] = self.pace.waits  # boundaries it waited for
        self.timings["largest_unit_cpu_s"] = self.pace.largest_unit_s
        self.built = True
        if not self.defer_connect:
            self.connect()

    def _make_mirror(self) -> None:
        """On every process of the handoff alike, old ranks and cold joiners (each works out the
        same slices from the global plan): the mirror's group, the mirror, and the executor of what
        it leaves to the switch; then the processes agree (``Mirror.agree``): where one has no
        mirror (its engine cannot replay, its copies did not fit), nobody mirrors."""
        t0 = time.perf_counter()
        s = self.spec
        members = sorted(set(s.old_procs) | set(s.procs))
        self._pause()
        group = Group.create(self.store, f"liver/gen{s.generation}/precopy", members, self.proc,
                             self.backend, self.device, self.timeout)
        mirror, why = None, ""
        try:
            replay = self.adapter.replay(self.job, self.device, self.old)
            slice_bytes, cap_bytes = self.precopy
            chosen = choose(self.plan, replay.replayable, cap_bytes, slice_bytes, to=members)
            if chosen.slices:
                mirror = Mirror.make(chosen, self.plan, self.adapter.state_specs(self.job), self.proc, group,
                                     self.budget_bytes, self.device, replay, pause=self._pause,
                                     storage=self.prebuilt.storage if self.prebuilt is not None else None,
                                     leader=members.index(s.old_procs[0]),
                                     followers=tuple(members.index(p) for p in members if p not in s.old_procs))
            else:
                why = "off: nothing moves"
        except NotReplayable as e:
            why = f"off: {e}"
        except torch.OutOfMemoryError:
            why = "off: the device has no memory for its copies"
        agreed = Mirror.agree(self.store, s.generation, members, self.proc, mirror.num_slices if mirror else 0,
                              self.timeout)
        if not agreed:
            self.timings["precopy"] = why or "off: another process of the handoff cannot mirror (its record says why)"
            group.destroy()
            return
        self.mirror = mirror
        mirror.overlap = not self.defer_connect  # (NCCL's default: each slice at its boundary)
        mirror.on_broken = lambda err: print(f"[liver] proc {self.proc}: generation {s.generation}'s pre-copy stopped "
                                             f"({err}); its switch, if it comes, streams everything", flush=True)
        self.rest = StreamingExecutor(self.plan, self.adapter.state_specs(self.job), self.proc, self.transfer,
                                      self.budget_bytes, self.device, pause=self._pause, select=mirror.precopy.left)
        self.rest.reserve()
        self.timings["precopy"] = "on"
        self.timings["precopy_s"] = time.perf_counter() - t0

    @property
    def defer_connect(self) -> bool:
        """"boundary": the first collectives wait for ``connect()`` at an iteration boundary that every
        member reaches together, so no communicator is created while the running generation has
        collectives in flight (for sites where that is unsafe); "background": right away."""
        return self.connect_at == "boundary"

    def connect(self) -> None:
        """Phase B: first collectives on every new group, point-to-point connections for the pairs
        the plan uses; then report ready. Communicators shared with the Active World are used by
        the training thread: from the companion thread they are left alone (the switch makes
        their point-to-point connections), at a boundary they are warmed too."""
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            training_thread = self.defer_connect
            connect_once([*(self.world.every_group() if self.world else []), self.transfer,
                          *((self.mirror.group,) if self.mirror is not None else ())])
            if self.world is not None:
                self.world.connect_pipeline(training_thread)
            members = self.transfer.members
            peer = {p: i for i, p in enumerate(members)}
            send_to, recv_from = set(), set()
            for _, tasks in self.plan.layer_tasks(self.proc):
                for t in tasks:
                    if t.kind == "send" and t.src_proc == self.proc:
                        send_to.add(peer[t.dst_proc])
                    elif t.kind == "send":
                        recv_from.add(peer[t.src_proc])
            if self.transfer.usable_from(training_thread):
                self.transfer.connect_p2p(sorted(send_to), sorted(recv_from))
            self.timings["connect_s"] = time.perf_counter() - t0
            self.timings["connect_cpu_s"] = time.thread_time() - c0
            self.timings["groups_s"] = self.timings["build_s"] + self.timings["connect_s"]
            if self.abandoned:
                return
            self.ready = True
            put(self.store, f"ready/{self.spec.generation}/{self.proc}", time.time())
        except BaseException as e:
            self._failed(e)

    def _failed(self, e: BaseException) -> None:
        """Reported at once (``error/{g}/{proc}``): the controller cancels the handoff with this
        reason; an abandoned preparation's end is no failure."""
        self.error = e
        if self.abandoned or isinstance(e, Abandoned):
            return
        try:
            write(self.store, Failure.key(self.generation, self.proc),
                  Failure(proc=self.proc, generation=self.generation, error=f"{type(e).__name__}: {e}"))
        except Exception:  # the store is gone: the job is ending
            pass



class Companion(threading.Thread):
    """Runs a Preparation beside the training loop."""

    def __init__(self, prep: Preparation, binding: Binding | None = None) -> None:
        super().__init__(name=f"companion-gen{prep.generation}", daemon=True)
        self.prep = prep
        self.binding = binding

    def run(self) -> None:
        # (not at a lower OS priority: a low-priority thread that holds the GIL would stall the
        # training thread behind it)
        if self.binding is not None:
            self.binding.free_this_thread()  # it, and its groups' threads, on any core: a spare one too
        self.prep.timings["cores"] = len(available())  # how many it may run on
        self.prep.run()

    def ready_generation(self) -> int:
        return self.prep.generation if self.prep.ready and not self.prep.abandoned else 0

    def built_generation(self) -> int:
        return self.prep.generation if self.prep.built and not self.prep.abandoned else 0

    def finish(self, timeout_s: float) -> None:
        """Deadline: the rest of the preparation at full speed, waited for."""
        self.prep.pace.unleash()
        self.join(timeout_s)

    def abandon(self) -> None:
        self.prep.abandoned = True
        self.prep.pace.unleash()  # a paced thread wakes up and stops at its next pause
        if not self.is_alive():  # else its thread lets go when it ends
            self.prep.release()
