"""A worker process of ``liver run``: forked by the node agent from its zygote (``liver.agent.zygote``),
or on its own as ``python -m liver.runtime.member SPEC.json``.

Started by the node agent, either with the first generation (or after a restart or a fail-stop
recovery: ``load_from`` names the checkpoint) or as a cold joiner of a pending generation. It
trains on its Active World, checks the consistent cut at every iteration boundary, prepares the
next generation in a companion thread, switches when every rank is ready, and leaves when the
new generation has no rank for it.
"""

from __future__ import annotations

import time

STARTED = time.time()

import collections  # noqa: E402
import faulthandler  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from liver.protocol.agent import IGNORE_SIGTERM  # noqa: E402
from liver import logs  # noqa: E402
from liver.host import cores, faults, priority, threads as host_threads  # noqa: E402
from liver.host.process import ProcessRef  # noqa: E402
from liver.checkpoint.periodic import PeriodicCheckpointer  # noqa: E402
from liver.engine.digest import DigestError, local_hashes, state_digest  # noqa: E402
from liver.engine.interface import EngineAdapter, StepStats, TrainingEngine  # noqa: E402
from liver.protocol import secret as job_secret, store as protocol  # noqa: E402
from liver.protocol.cut import agree, confirm  # noqa: E402
from liver.world import group  # noqa: E402
from liver.protocol.messages import (Fence, GenerationSpec, Progress, Saved, Stalled, StartReport,  # noqa: E402
                                    StopReport, SwitchReport, write)
from liver.protocol.store import COMMIT, WITHDRAW, decide as decide_key  # noqa: E402
from liver.runtime.boundary import Local, after_force, decide  # noqa: E402
from liver.runtime.companion import Companion, Preparation  # noqa: E402
from liver.runtime.courier import Courier, Post  # noqa: E402
from liver.runtime.fence import FENCED, Guard  # noqa: E402
from liver.transfer.rehearsal import rehearse  # noqa: E402
from liver.runtime.mock import rehearse_step, warm_up  # noqa: E402
from liver.runtime.pace import Pace  # noqa: E402
from liver.engine.loop import Steps  # noqa: E402
from liver.config.fields import from_dict  # noqa: E402
from liver.protocol.worker import WorkerSpec  # noqa: E402
from liver.runtime.switch import switch  # noqa: E402
from liver.world.world import World, connect_store  # noqa: E402

IMPORTED = time.time()
ENDS_KEPT = 128  # the step ends a step record carries: a controller that looks late finds its trigger's
STALL_EXPECTED_S = 10.0  # after a peer's fence, the training thread has stalled by then (else: its stacks logged)


class Member:
    def __init__(self, spec: WorkerSpec, boot: dict[str, float]) -> None:
        self.spec = spec
        self.boot = boot
        self.proc: int = spec.proc
        faults.identify(self.proc)
        cfg = self.config = spec.config
        self.job = cfg.job
        self.backend: str = cfg.backend
        self.run_dir = Path(spec.run_dir)
        self.total_steps: int = cfg.steps
        # "step": a state digest after every step; "switch": right before and after each handoff
        self.digest: str | None = cfg.digest
        self.binding = cores.Binding(list(spec.cores) if spec.cores is not None else None)
        if spec.role != "joiner":
            self.binding.bind()  # a joiner boots on idle time anywhere; bound when it holds a rank
        threads = host_threads.worker_threads(self.backend)  # (the template ran single-threaded)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # (libraries read it)
        torch.set_num_threads(threads)
        if self.backend == "nccl":
            torch.cuda.set_device(spec.slot)
            self.device = torch.device("cuda", spec.slot)
        else:
            self.device = torch.device("cpu")
        self.secret = job_secret.from_env()  # (its agent's: the job's store keys and its plans' seals)
        self.store = protocol.run_store(connect_store(spec.store_addr), self.secret)
        # its step records, heartbeat and the controller's wish, each on a thread and connection of its own
        self.courier = Courier(lambda: protocol.run_store(connect_store(spec.store_addr), self.secret), spec.proc,
                               self.run_dir / "steps.jsonl")
        self.ckpt = PeriodicCheckpointer(self.run_dir / "ckpt", cfg.checkpoint.every, proc=self.proc,
                                         keep=cfg.checkpoint.keep)
        self.adapter = cfg.adapter
        self.engine: TrainingEngine | None = None
        self.companion: Companion | None = None
        self.into: dict[str, torch.Tensor] | None = None  # a joiner's storage for the new state
        self.preparing_since: float | None = None
        # the companions' store connection (made now, not beside the first preparation's steps)
        self._side = protocol.run_store(connect_store(spec.store_addr), self.secret)
        self._side_user: Companion | None = None  # the last companion that used it
        self._switching = False
        self._digest_failed_in: int | None = None  # the generation whose step digests failed (said once)
        self._stalled_in: int | None = None  # the generation it last stalled in (a later fence arms no watchdog)
        self._half_streamed = False  # a switch failed under it: its old state is no longer whole
        self._ends: collections.deque[tuple[int, float]] = collections.deque(maxlen=ENDS_KEPT)  # rank 0's (step, end)
        # fenced (its node declared lost), a fenced peer, or cut off from the store: its own thread
        self._guard_store = protocol.run_store(connect_store(spec.store_addr), self.secret)
        self._store_port = int(spec.store_addr.rsplit(":", 1)[1])
        self.guard = Guard(self._guard_store, self.proc, self._peer_fenced, cfg.orphan_after_s,
                           lambda: self.courier.contact, self.courier.silence,
                           agent=ProcessRef.parse(spec.agent) if spec.agent else None)

    def _preparation(self, spec: GenerationSpec, **kw: Any) -> Preparation:
        c = self.config
        p = c.prepare
        precopy = ((p.precopy_slice_mib << 20) or None, p.precopy_memory_mib << 20) if p.precopy else None
        return Preparation(adapter=self.adapter, job=self.job, spec=spec, proc=self.proc, backend=self.backend, device=self.device,
                           timeout_s=p.group_timeout_s, budget_bytes=c.transfer.budget_bytes,
                           connect=c.connect, precopy=precopy, secret=self.secret, **kw)

    # ---- entering a generation -----------------------------------------------------------
    def start(self) -> None:
        """First generation, restart or recovery: build the World, create or load the state."""
        g = self.spec.generation
        spec = GenerationSpec.fetch(self.store, g)
        layout = self.adapter.layout(self.job, spec.parallel)
        t0 = time.perf_counter()
        world = World.build(self.store, g, layout, spec.procs.index(self.proc), self.backend,
                            self.device, cpu_groups=True, procs=spec.procs)
        world.connect()
        world.activate()
        os.environ.update(torchrun_env(spec, world.rank, self.spec.slot))
        timings = {"group_init_s": time.perf_counter() - t0}
        t0 = time.perf_counter()
        self.engine = self.adapter.build(self.job, world, self.device, initialise=spec.load_from is None)
        timings["build_s"] = time.perf_counter() - t0
        if spec.load_from:
            timings["load_s"] = self.adapter.load_checkpoint(self.engine, spec.load_from)
        rec = {"proc": self.proc, "generation": g, "timings": timings, **self.boot, "ready": time.time(),
               "step": self.engine.step, "cores": cores.available()}
        if self.digest:
            self._digest_into(rec, self.engine, "digest_after")
        write(self.store, StartReport.key(g, self.proc), from_dict(StartReport, rec, "start report"))

    def join(self) -> bool:
        """Cold joiner: warm up on a mock world, prepare the Shadow World, receive the state. False:
        its generation was withdrawn first (nothing to train)."""
        g = self.spec.generation
        spec = GenerationSpec.fetch(self.store, g)
        layout = self.adapter.layout(self.job, spec.parallel)
        t0 = time.perf_counter()
        rehearsed = warm_up(self.adapter, self.job, layout, spec.procs.index(self.proc), self.backend, self.device,
                       self.config.prepare.mock_steps, generation=g)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.into = self.adapter.joiner_storage(rehearsed)  # in the new layout: the transfer may write into it
        del rehearsed
        warmup_s = time.perf_counter() - t0
        # a generation withdrawn under it (a controller cancelled it, or one resumed after its death)
        # ends it here by itself: stopped from outside inside a Gloo rendezvous, it would hold the
        # other members there until their group timeout
        withdrawn = lambda: protocol.decided(self.store, g) == WITHDRAW  # noqa: E731
        prep = self._preparation(spec, store=self.store, withdrawn=withdrawn)
        prep.run()
        if prep.defer_connect and prep.built and not prep.ready and not prep.abandoned:
            prep.connect()  # NCCL: with the old ranks, when they reach their boundary
        # with a pre-copy it follows the old ranks' steps until the switch (runtime/mirror.py)
        followed = prep.mirror.follow(withdrawn) if prep.mirror is not None and prep.ready else True
        if prep.abandoned or followed is None or not self._committed(g):
            print(f"[liver] proc {self.proc}: generation {g} was withdrawn before it began; this joiner ends", flush=True)
            return False
        if not prep.ready:
            raise RuntimeError(f"proc {self.proc}: preparing generation {g} failed: {prep.error!r}")
        prep.timings["mock_warmup_s"] = warmup_s
        # its CPU time (every thread) from its start to holding a rank: what it took from a shared node
        prep.timings["joiner_cpu_s"] = time.process_time()
        # a rank from this handoff on: it waits in the transfer for the old ranks' boundary
        priority.normal()
        self.binding.bind()
        self._switch(prep, dict(self.boot))
        return True

    def _committed(self, g: int) -> bool:
        """Whether generation ``g`` is switched to: its rank 0 commits once every member is ready,
        the controller may withdraw it first (``protocol/store.py``). Waits for either; the
        controller stops a joiner whose old ranks are gone."""
        key = f"decision/{g}"
        while True:
            try:
                self.store.wait([key], timedelta(seconds=1))
                return protocol.decided(self.store, g) == COMMIT
            except RuntimeError:  # (DistStoreError: not yet)
                continue

    # ---- the training loop ---------------------------------------------------------------
    def train(self) -> None:
        """The engine's loop, or the recipe's own (``adapter.drive``), over LiveR's iterations."""
        self.adapter.drive(Steps(self, self.adapter.make_step))
        self.ckpt.wait()

    def can_stall(self) -> bool:
        return not self._switching and self.engine is not None and self.engine.world.all.size > 1

    def after_step(self, st: StepStats) -> None:
        """A step's record (and digest), then the boundary after it."""
        e = self.engine
        end = time.time()
        digest, digest_s, digest_error, broke = None, 0.0, None, None
        if faults.once("drift", self.proc, st.step):
            _drift(e)
        if self.digest == "step":  # a check, timed apart from the step
            t0 = time.perf_counter()
            try:
                digest = state_digest(e)
            except DigestError as err:  # (the check's finding: said once a generation, training goes on)
                digest_error = str(err)[:500]
                if self._digest_failed_in != e.world.generation:
                    self._digest_failed_in = e.world.generation
                    print(f"[liver] proc {self.proc}: no digest after step {st.step} (and none said again in "
                          f"generation {e.world.generation}): {err}", flush=True)
            except RuntimeError as err:  # the step is done (its state moved on): it is logged first
                broke = err
            digest_s = time.perf_counter() - t0
        if e.world.rank == 0:
            self._ends.append((st.step, end))
        logged, post = self.config.log_rank in (-1, e.world.rank), None
        if e.world.rank == 0 or logged:
            rec = Progress(step=st.step, generation=e.world.generation, loss=st.loss, step_s=st.step_s,
                           time=end, parallel=e.layout.parallel.short(), preparing=self.companion is not None,
                           tokens_per_s=st.tokens_per_s, grad_norm=st.grad_norm, mfu=st.mfu,
                           digest=digest, digest_s=digest_s, digest_error=digest_error,
                           **(self.ckpt.standing() if e.world.rank == 0 and self.ckpt.every else {}),
                           ends=None)
            who = f"[rank {e.world.rank}] " if self.config.log_rank == -1 else ""
            post = Post(rec, to_store=e.world.rank == 0, log_as=who if logged else None,
                        ends=tuple(self._ends) if e.world.rank == 0 else (),
                        gpu=self.device if self.device.type == "cuda" else None)
        if broke is not None:
            if post is not None:
                self.courier.post(post)
            raise broke
        self.boundary(st.step_s, post)

    # ---- a generation broken under it --------------------------------------------------------
    def _peer_fenced(self, fence: Fence) -> None:
        """(The guard's thread.) A process of the generation it trains in was fenced: its
        collectives blocked on that peer fail now (``World.interrupt``), and it stalls to be
        healed (``stall``) instead of waiting the group's timeout on a node that is gone."""
        e = self.engine
        if e is None:
            return
        try:
            procs = GenerationSpec.fetch(self._guard_store, e.world.generation).procs
        except (RuntimeError, ValueError):
            return
        if set(fence.procs) & set(procs) and e is self.engine:
            cut = e.world.interrupt({self._store_port})
            print(f"[liver] proc {self.proc}: process {sorted(set(fence.procs) & set(procs))} of generation "
                  f"{e.world.generation} was fenced (node {fence.node} lost); {cut} connections cut", flush=True)
            # where the training thread has not stalled by then, every thread's stack goes to its log:
            # the heal waits for this process, and where it is held says why (about 2 in 80 runs of the
            # fenced-node test it was: a gloo all-reduce the cut did not wake, then the stall's abort
            # waiting for it; ``Group.wait`` slices, ``group._park``); the watchdog is faulthandler's,
            # which needs no GIL
            if self._stalled_in != e.world.generation:  # (stalled already: nothing to watch for)
                faulthandler.dump_traceback_later(STALL_EXPECTED_S, file=sys.stdout)

    def stall(self, err: BaseException) -> None:
        """Stop where the last step completed (an engine changes its state only after the step's
        last collective), tell the controller, and wait to be healed: a new generation built from
        the survivors' memory (``heal/{g}``), entered like a joiner enters one. No heal within the
        groups' timeout: the error stands (the controller stops everyone and recovers from the
        checkpoint)."""
        e = self.engine
        g = e.world.generation
        # a write in flight over the broken groups never becomes the latest; abandoned before they
        # break, so that its thread, failing on them, takes itself for abandoned (not a failed write)
        self.ckpt.abandon()
        # peers blocked on a group with this rank fail now too, and stall as well: its connections
        # are cut (``World.interrupt``: all but the store's), not only its groups let go, since a
        # framework may hold a group's process group (Megatron's model does) and so keep gloo's
        # connections open: a survivor blocked in an all-reduce with this stalled rank waited for
        # the whole heal timeout, and the job rolled back to its checkpoint (3 of 4 runs of a
        # Megatron tp1pp2dp2 scale-in whose deadline no handoff fits)
        e.world.interrupt({self._store_port})
        e.world.abort()
        parked = group.parked()
        if parked:
            print(f"[liver] proc {self.proc}: {parked} communicator(s) of generation {g} parked: gloo was "
                  f"still in a collective the cut did not wake (it ends at the groups' timeout)", flush=True)
        if getattr(e, "mirror", None) is not None:
            e.mirror.abort()  # (its copy may be blocked on the lost peer)
        if self.companion is not None:
            self._abandon()
        hashes = None
        if self.digest and not self._half_streamed:
            try:
                hashes = local_hashes(e)
            except RuntimeError as why:  # (a check's refusal must not turn a heal into a job's end)
                print(f"[liver] proc {self.proc}: no digest of the state it stopped with ({why})", flush=True)
        write(self.store, Stalled.key(g, self.proc),
              Stalled(proc=self.proc, generation=g, step=e.step, error=f"{type(err).__name__}: {err}"[:500],
                      hashes=hashes, scalars=e.scalars() if hashes is not None else None))
        # reported: the watchdog a peer's fence armed is done (cancelled here, not on entering: in
        # the heal that never came, the survivor had entered the stall and was held in its abort)
        self._stalled_in = g
        faulthandler.cancel_dump_traceback_later()
        print(f"[liver] proc {self.proc}: generation {g} broke after step {e.step} ({type(err).__name__}); "
              f"waiting to be healed", flush=True)
        end = time.time() + self.config.prepare.group_timeout_s
        key = Stalled.heal_key(g)
        while not self.store.check([key]):
            if time.time() > end:
                raise err
            time.sleep(0.01)
        spec = GenerationSpec.fetch(self.store, int(self.store.get(key)))
        if self.proc not in spec.procs:  # left out of the heal: its node was declared lost (fenced), or no
            self.courier.silence()       # configuration uses every survivor
            print(f"[liver] proc {self.proc}: not in the heal generation {spec.generation} (its node was declared "
                  f"lost, or no configuration uses every survivor); it stops without another step", flush=True)
            sys.stdout.flush()
            os._exit(FENCED)
        if self.proc not in spec.old_procs:  # it stopped a step behind the heal's: it receives, as a joiner
            stale, self.engine = e, None
            stale.release_compute()
            threading.Thread(target=stale.world.destroy, daemon=True).start()
            del stale, e
        prep = self._preparation(spec, store=self.store, old=self.engine)  # nothing shared with the broken groups
        prep.run()
        if prep.defer_connect and prep.built and not prep.ready:
            prep.connect()
        if not prep.ready:
            raise RuntimeError(f"proc {self.proc}: preparing the heal generation {spec.generation} failed: "
                               f"{prep.error!r}") from err
        self._switch(prep, {}, old_alive=False)

    def _side_store(self):
        """The companions' store connection: a rendezvous blocked on a late joiner must not queue
        the training thread's store reads behind it on one socket. Made once, and again only while
        an abandoned companion may still be blocked on the last one."""
        if self._side_user is not None and self._side_user.is_alive():
            self._side = protocol.run_store(connect_store(self.spec.store_addr), self.secret)
        return self._side

    def boundary(self, step_s: float, post: Post | None = None) -> None:
        """The consistent cut: every rank takes the same decision here (``runtime/boundary.py``).
        ``post``: the step's record, handed to the courier once the cut's collective is done (its
        thread's work then overlaps the next step, not this wait: both need the GIL), or has
        broken: the step is done and its state kept, so its record is never lost with the cut."""
        e, c = self.engine, self.companion
        if c is not None:
            c.prep.pace.boundary(step_s)  # its next slice
        wish = self.courier.wish() if e.world.rank == 0 else None
        mirror = c.prep.mirror if c is not None and c.prep.ready else None
        try:
            cut = agree(e.world.all, wish, c.ready_generation() if c else 0, self.ckpt.busy(),
                        c.built_generation() if c else 0,
                        mirror.num_slices if mirror is not None and mirror.broken is None else 0)
        finally:  # (a peer lost in the cut: the survivors heal from this step, logged like any other)
            if post is not None:
                self.courier.post(post)
        me = Local(step=e.step, generation=e.world.generation, preparing=c.prep.generation if c else 0,
                   built=bool(c and c.prep.built), ready=bool(c and c.prep.ready),
                   defer_connect=bool(c and c.prep.defer_connect), checkpoint_due=self.ckpt.due(e),
                   precopied=mirror.started if mirror else 0)
        act = decide(cut, me)
        if act.stop:
            return self._stop_for_restart()
        if act.end_at:
            self.total_steps = min(self.total_steps, max(act.end_at, e.step))
        if act.abandon:
            self._abandon()  # cancelled or superseded: the Active World was never touched
        if act.prepare:
            self._prepare(act.prepare, step_s)
        if act.force:
            c.finish(self.config.prepare.group_timeout_s)  # deadline: the rest at full speed, waited for
            if c.prep.defer_connect and c.prep.built and not c.prep.ready:
                c.prep.connect()
            busy = bool(cut.ckpt_busy)
            cut = agree(e.world.all, None, c.ready_generation())  # (no pre-copy's slices: none are used)
            act = after_force(cut, c.prep.generation, me.checkpoint_due, busy)
        elif act.connect:
            c.prep.connect()  # every member creates the communicators' connections now, together
        if act.checkpoint:
            self.ckpt.start(e)
        if act.precopy:
            e.mirror = mirror  # the engine replays each update on it from now on
            mirror.start_next(e.state)
        if act.propose:
            # rank 0 commits unless the controller withdrew first (one compare-and-set); every rank
            # learns which from one more all-reduce
            mine = act.propose if e.world.rank == 0 and decide_key(self.store, act.propose, COMMIT) == COMMIT else 0
            if confirm(e.world.all, mine) == act.propose:
                prep = self.companion.prep
                self.companion = None
                if self.ckpt.busy():  # (only a deadline's forced switch does not wait for the write)
                    self.ckpt.abandon()
                if prep.mirror is not None:  # every old rank alike: all mirrored, none broken, at this cut
                    prep.mirror.announce_switch(prep.mirror.complete and cut.precopy_slices > 0)
                self._switch(prep, {})
            else:
                self._abandon()

    def _abandon(self) -> None:
        if self.engine is not None:
            self.engine.mirror = None
        self.companion.abandon()
        self.companion = None

    def _prepare(self, g: int, step_s: float) -> None:
        spec = GenerationSpec.fetch(self.store, g)
        pace = Pace(self.config.prepare.companion_share, step_s)
        self.companion = Companion(self._preparation(spec, store=self._side_store(), active=self.engine.world,
                                                     pace=pace, old=self.engine), self.binding)
        self._side_user = self.companion
        self.preparing_since = time.time()
        self.companion.start()

    def _switch(self, prep: Preparation, extra: dict[str, Any], old_alive: bool = True) -> None:
        """``old_alive``: the old generation's groups work (not so in a heal: no digest over them).
        A failure in here leaves the old shards half streamed away: the process still stalls (it
        stays for the controller, which recovers a broken switch from the checkpoint on the slots
        left), but reports no part of a digest of a state it no longer holds whole."""
        self._switching = True
        try:
            self._switch_now(prep, extra, old_alive)
        except BaseException:
            self._half_streamed = True  # (the error reaches the loop after this frame is gone)
            raise
        finally:
            self._switching = False

    def _digest_into(self, rec: dict[str, Any], engine: TrainingEngine, key: str) -> None:
        """``rec[key]``: the state's digest (collective), and its time; where the state cannot be
        digested as it stands (``DigestError``: replicas that differ, say), ``rec["digest_error"]``
        says why, the log too, and the handoff goes on: the check reports, it does not stop the
        job (the summary and the command's exit status say so)."""
        t0 = time.perf_counter()
        try:
            rec[key] = state_digest(engine)
        except DigestError as e:
            rec["digest_error"] = "; ".join(x for x in (rec.get("digest_error"), f"{key.replace('_', ' ')}: {e}") if x)
            print(f"[liver] proc {self.proc}: no {key.replace('_', ' ')}: {e}", flush=True)
        rec[f"{key}_s"] = time.perf_counter() - t0

    def _switch_now(self, prep: Preparation, extra: dict[str, Any], old_alive: bool) -> None:
        old = self.engine
        self.courier.drain()  # this generation's records out before the next's rank 0 writes
        g = prep.generation
        rec: dict[str, Any] = {"proc": self.proc, "generation": g, **extra,
                               "prepare": prep.timings, "preparing_since": self.preparing_since}
        if old is not None and self.device.type == "cuda":
            torch.cuda.synchronize()  # drain
        if old is not None:
            rec["old_step"] = old.step
            if old_alive:  # (every old rank is at this boundary: a collective over its groups)
                old.align_replicas()
            if self.digest == "switch" and old_alive:
                self._digest_into(rec, old, "digest_before")
        base = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        rec["switch_start"] = time.time()
        into, self.into = self.into, None
        # a whole mirror: the switch moves the rest; one cut short (a deadline, a peer lost): everything
        # moves (the old ranks decided at the boundary, old rank 0 told the joiners that follow)
        mirror = prep.mirror if prep.mirror is not None and prep.mirror.used else None
        if old is not None and getattr(old, "mirror", None) is not None:
            old.mirror = None
        new, info = switch(adapter=self.adapter, job=self.job, old=old, new_world=prep.world,
                           executor=prep.rest if mirror else prep.executor, device=self.device, into=into,
                           prebuilt=prep.prebuilt, mirrored=mirror.storage if mirror else None)
        if prep.mirror is not None:
            rec["precopy"] = {**prep.mirror.stats, "used": mirror is not None, "follower": old is None,
                              "slices_mirrored": prep.mirror.current}
            prep.mirror.drop()  # (its shards are the new engine's now; its group goes)
        del into
        rec["switch_end"] = time.time()
        rec["transfer"] = info
        if self.device.type == "cuda":
            rec["mem_before_bytes"] = base
            rec["mem_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        if old is not None:
            old_world, ckpt_thread = old.world, self.ckpt
            old_world.deactivate()
            self.engine = None
            # cleanup off the critical path: after any checkpoint still writing from the old World
            # the new generation's threads (its groups', started by the companion) bound as well
            threading.Thread(target=lambda: (self.binding.bind(), ckpt_thread.wait(), old_world.destroy()),
                             daemon=True).start()
        transfer = prep.transfer
        threading.Thread(target=transfer.destroy, daemon=True).start()
        self.engine = new
        self.preparing_since = None
        if self.device.type == "cuda":
            del old
            rec["mem_after_bytes"] = torch.cuda.memory_allocated(self.device)
            # beyond the larger of the two steady states (old alone before, new alone after); the
            # staging ring and the storage made in Prepare are part of the handoff's extra memory
            ring = prep.executor.staging_bytes + (prep.prebuilt.storage_bytes if prep.prebuilt else 0)
            rec["staging_reserved_bytes"] = ring
            rec["peak_extra_bytes"] = rec["mem_peak_bytes"] - max(base - ring, rec["mem_after_bytes"])
        if new is not None:
            new.world.activate()
            os.environ.update(torchrun_env(prep.spec, new.world.rank, self.spec.slot))
            rec["new_rank"] = new.world.rank
            rec["cores"] = cores.available()
            rec["step"] = new.step
            if self.digest:
                self._digest_into(rec, new, "digest_after")
        write(self.store, SwitchReport.key(g, self.proc), from_dict(SwitchReport, rec, "switch report"))

    def _stop_for_restart(self) -> None:
        """Restart mode: write a checkpoint at this boundary and stop (the baseline's save)."""
        e = self.engine
        self.ckpt.wait()
        self.courier.drain()
        g = e.world.generation
        path = self.run_dir / "restart" / f"gen{g}-step{e.step:08d}"
        rec: dict[str, Any] = {"proc": self.proc, "generation": g, "step": e.step}
        e.align_replicas()  # (what the checkpoint saves of replicas that drifted: nothing else changes)
        if self.digest == "switch":
            self._digest_into(rec, e, "digest_before")
        rec["save_s"] = self.adapter.save_for_restart(e, str(path))
        rec["saved_at"] = time.time()
        write(self.store, StopReport.key(g, self.proc), from_dict(StopReport, rec, "stop report"))
        if e.world.rank == 0:
            write(self.store, Saved.key(g), Saved(path=str(path), step=e.step))
        e.world.destroy()
        self.engine = None


def torchrun_env(spec: GenerationSpec, rank: int, slot: int) -> dict[str, str]:
    """The variables torchrun sets, for this process in generation ``spec`` (libraries read them):
    its rank and the world's size, its device's index on the node (``LOCAL_RANK``) and the
    generation's processes on its node."""
    nodes = spec.nodes or ("",) * len(spec.procs)
    return {"RANK": str(rank), "WORLD_SIZE": str(len(spec.procs)), "LOCAL_RANK": str(slot),
            "LOCAL_WORLD_SIZE": str(nodes.count(nodes[rank])), "GROUP_RANK": str(sorted(set(nodes)).index(nodes[rank]))}


def rehearse_process(adapter: EngineAdapter, cpu_step: bool = False) -> None:
    """Once per interpreter, before it trains: the companion's code paths rehearsed (and, with
    ``cpu_step``, a CPU training step), so that no preparation beside training pays first-use
    costs; then the interpreter's objects so far (torch and its modules) leave the cyclic garbage
    collector's view, so that a full collection (which holds the GIL) walks only what came after:
    a companion's burst of allocations (a transfer schedule) would otherwise set one off and stall
    training for about a tenth of a second. The zygote does it
    before it forks (liver/runtime/preload.py); a worker on its own interpreter, in ``main``."""
    rehearse(adapter)
    if cpu_step:
        rehearse_step(adapter)
    gc.collect()
    gc.freeze()


def _drift(e: TrainingEngine) -> None:
    """(Fault ``drift``.) One element of the first replicated parameter this process holds, one
    unit in the last place up: its replicas no longer agree."""
    spec = next(s for s in e.specs if s.kind == "param" and s.shard_dim is None and s.name in e.state)
    t = e.state[spec.name]
    flat = (t.to_local() if hasattr(t, "to_local") else t).data.view(-1)
    with torch.no_grad():
        flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=flat.dtype, device=flat.device))
    print(f"[liver] fault drift: {spec.name}[0] moved by one unit in the last place", file=sys.stderr, flush=True)


def main(spec_path: str | None = None, boot: dict[str, float] | None = None) -> None:
    """``boot``: when the process started and finished its imports, given by the zygote that
    forked it (both the fork's time: its template did the imports and ``rehearse_process``); without
    it, a worker on its own interpreter: this module's import times, and ``rehearse_process`` now."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the controller's: it stops the workers
    logs.setup_steps()
    if os.environ.get(IGNORE_SIGTERM) == "1":  # a preemption notice by SIGTERM is the node agent's
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to its log
    spec = WorkerSpec.read(spec_path or sys.argv[1])
    if boot is None:
        rehearse_process(spec.config.adapter)
    m = Member(spec, boot or {"process_start": STARTED, "imported": IMPORTED})
    if spec.role == "joiner":
        if not m.join():
            m.courier.drain()
            sys.stdout.flush()
            os._exit(0)  # its preparation's groups may still wait for members that left
    else:
        m.start()
    try:
        m.train()
    finally:
        m.courier.drain()
    if m.engine is not None:
        m.engine.world.destroy()
    sys.stdout.flush()
    os._exit(0)  # abandoned preparations may still wait in a rendezvous


if __name__ == "__main__":
    main()
