"""The job under a stream of GPU changes, for one way of handling them (a ``Policy``), in SimPy.

Between changes the job trains at the step time of its configuration (``costs.step_time``). A
change is handled as its policy does it, one at a time, in the order they come (the ones that
came while another was handled are merged into one, to the last count, as the controller merges its
queue): a notice starts a live handoff's preparation beside training (slower by the steady-state
overhead), then its pause; a restart pauses for all of its phases; a loss that comes before the
handoff is ready (or without notice) is a fail-stop: the work since the last checkpoint is lost,
unless the policy heals from replicas. Periodic checkpoints are taken every ``ckpt_interval_s``.

Where the job runs on fewer GPUs than there are, a loss takes whole nodes at random, as a
provider does, not the idle ones first (``losses``): one that takes only idle nodes costs
nothing; one that takes a node of the job's is handled as the controller handles a node's
notice: the job goes on the GPUs of its own left (``controller.handling``), the idle ones stay
idle until GPUs come.

Goodput (DESIGN.md): useful training time / wall time, counting downtime, lost (rolled-back) work
and slower steps. ``efficiency``: the samples trained against those an ideal job (no cost to
change, the best configuration for the GPUs there are at every moment) would have trained; it
also counts the slower configurations a policy is held to (data-parallel-only resizing).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator

import simpy

from liver.engine.interface import EngineAdapter
from liver.engine.reference import ADAPTER
from liver.policy import costs, target
from liver.policy.workload import Workload
from liver.policy.decisions import NoticeAction, on_notice
from liver.topology import ParallelConfig
from liver.policy.events import EventKind
from liver.policy.moves import LIVE, RESTART_FROM_CHECKPOINT, Move, RestartMove
from liver.policy.profile import Profile
from liver.sim.losses import RandomNodes, Takes
from liver.sim import sources
from liver.sim.sources import Change
from liver.topology import JobConfig, Layout


@dataclass
class Outcome:
    policy: str
    wall_s: float
    useful_s: float = 0.0
    samples: float = 0.0
    ideal_samples: float = 0.0
    downtime_s: float = 0.0
    lost_s: float = 0.0
    slow_s: float = 0.0           # training time lost to the overhead of preparing beside it
    idle_s: float = 0.0           # no configuration fits the GPUs there are
    merged: int = 0               # changes merged into a later one (queued while another was handled)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s else 0.0

    @property
    def efficiency(self) -> float:
        return self.samples / self.ideal_samples if self.ideal_samples else 0.0

    def summary(self) -> dict[str, Any]:
        return {"policy": self.policy, "wall_s": self.wall_s, "goodput": self.goodput, "efficiency": self.efficiency,
                "useful_s": self.useful_s, "downtime_s": self.downtime_s, "lost_s": self.lost_s, "slow_s": self.slow_s,
                "idle_s": self.idle_s, "events": len(self.events), "merged": self.merged,
                "fail_stops": sum(e["kind"] == "fail-stop" for e in self.events)}


class Sim:
    """One run: ``start_gpus`` at time 0, then ``changes``, for ``hours``."""

    def __init__(self, job: JobConfig, prof: Profile, policy: "Policy", start_gpus: int, changes: list[Change],
                 hours: float, ckpt_interval_s: float = 1800.0, overhead: float = 0.002,
                 adapter: EngineAdapter = ADAPTER, takes: Takes | None = None) -> None:
        sources.check("hours", hours)
        sources.check("ckpt_interval_s", ckpt_interval_s)
        if not 0 <= overhead < 1:
            raise ValueError(f"overhead={overhead!r}: allowed 0 to below 1 (the share of a step lost beside a preparation)")
        if start_gpus < 0 or any(c.gpus < 0 or c.notice_s < 0 for c in changes):
            raise ValueError(f"start_gpus={start_gpus} and the changes: allowed GPU counts and notices of 0 or more")
        self.job, self.prof, self.policy = job, prof, policy
        self.adapter, self.hw = adapter, target.Hardware.of(prof)  # (the controller's target choice, on them)
        self.work = Workload(adapter, job)  # (what the cost model prices)
        self.changes, self.end = sorted(changes, key=lambda c: c.t), hours * 3600
        self.avail = start_gpus
        self.ckpt_interval_s, self.overhead = ckpt_interval_s, overhead
        self.takes = RandomNodes() if takes is None else takes  # (which GPUs a loss takes)
        self.out = Outcome(policy.name, self.end)
        self.layout: Layout | None = policy.first(self, start_gpus)
        self._ckpt = (0.0, 0.0, 0.0)  # (time, useful, samples) at the last checkpoint

    # ---- time ------------------------------------------------------------------------------
    def step_s(self, lay: Layout) -> float:
        return target.step_time(self.work, lay, self.hw)

    def best(self, gpus: int, move: Move | None = None) -> Layout | None:
        """What the controller would run on the most of ``gpus`` GPUs that any layout can use:
        the fastest, or counting the ``move`` from the configuration the job runs (``moves``)."""
        if move is None or self.layout is None:
            return target.best_up_to(self.adapter, self.job, gpus, self.hw)
        return target.best_up_to(self.adapter, self.job, gpus, self.hw, self.layout.parallel, move)

    def usable(self, c: Change) -> int | None:
        """The GPUs the job lays itself out on after ``c``: all there are after a gain, or where it
        runs on none; after a loss, its own that are left (the controller takes a node's notice so:
        the ranks on it leave, idle GPUs are not drawn in), None where only idle ones went."""
        if self.layout is None or c.gpus >= self.avail:
            return c.gpus
        hit = self.takes.job_lost(self.avail, c.gpus, self.layout.size, self.prof.node_size, str(self._place[c]))
        return None if hit == 0 else min(c.gpus, self.layout.size - hit)

    def recovery(self, c: Change, survivors: Layout) -> Layout:
        """Where a loss falls back to the checkpoint: the configuration the job restarts on. Without
        notice (a fail-stop) every process starts afresh, so idle GPUs take the lost ones' places,
        up to the job's size (the controller's recovery, ``Failures.from_checkpoint``); after a
        notice whose handoff missed the GPUs' going, on ``survivors``' (the notice's target)."""
        if c.notice_s > 0:
            return survivors
        return self.best(min(c.gpus, self.layout.size), RESTART_FROM_CHECKPOINT) or survivors

    @staticmethod
    def heals(lay: Layout, lost: int) -> bool:
        """Whether the ranks left after ``lost`` of the job's GPUs go without notice still hold every
        shard of the state, so that a heal from their memory loses nothing (``policy.heal``, the
        controller's check): the engine's state is its (stage, TP rank) shards, whole on every
        data-parallel replica, and rank ``t + tp * (d + dp * s)`` is on GPU of that index, nodes of
        consecutive GPUs (Megatron's order, TP groups within a node). The GPUs lost are the job's
        first (the worst case: consecutive nodes, a stage's replicas side by side). A node that
        holds every replica of a stage (TP x DP no larger than a node: tp2pp79dp4 on nodes of 8)
        takes the shard with it: the checkpoint is the fallback. ``tests/test_sim.py`` checks it
        against ``policy.heal.uncovered`` over the reference engine's tensors."""
        gone = min(lost, lay.size)
        return all(any(t + lay.tp * (d + lay.dp * s) >= gone for d in range(lay.dp))
                   for s in range(lay.pp) for t in range(lay.tp))

    def train(self, env: simpy.Environment, dt: float, rate: float = 1.0) -> Iterator[Any]:
        """``dt`` of training (at ``rate`` of full speed: a preparation beside it), or idling when
        no configuration fits."""
        dt = max(0.0, min(dt, self.end - env.now))
        if dt <= 0:
            return
        if self.layout is None:
            self.out.idle_s += dt
        else:
            t0, u0, s0 = env.now, self.out.useful_s, self.out.samples
            self.out.useful_s += dt * rate
            self.out.slow_s += dt * (1 - rate)
            self.out.samples += dt * rate / self.step_s(self.layout) * self.job.train.global_batch
            k = self.ckpt_interval_s
            last = int((t0 + dt) // k) * k  # the last periodic checkpoint in this stretch
            if last > self._ckpt[0] and last >= t0:
                f = (last - t0) / dt
                self._ckpt = (last, u0 + f * (self.out.useful_s - u0), s0 + f * (self.out.samples - s0))
        yield env.timeout(dt)

    def pause(self, env: simpy.Environment, dt: float) -> Iterator[Any]:
        dt = max(0.0, min(dt, self.end - env.now))
        self.out.downtime_s += dt
        if dt > 0:
            yield env.timeout(dt)

    def checkpointed(self, env: simpy.Environment) -> None:
        """The whole state is saved now (a restart's save): nothing before this can be lost."""
        self._ckpt = (env.now, self.out.useful_s, self.out.samples)

    def roll_back(self) -> float:
        """A fail-stop: the work since the last checkpoint is lost; returns its training time."""
        _, u, s = self._ckpt
        lost = self.out.useful_s - u
        self.out.lost_s += lost
        self.out.useful_s, self.out.samples = u, s
        return lost

    def record(self, env: simpy.Environment, kind: str, **kw: Any) -> None:
        self.out.events.append({"t": env.now, "kind": kind, "gpus": self.avail,
                                "config": self.layout.parallel.short() if self.layout else None, **kw})

    # ---- the run ---------------------------------------------------------------------------
    def _job(self, env: simpy.Environment) -> Iterator[Any]:
        actions, prev = [], 0.0
        for c in self.changes:  # a notice comes notice_s before its loss, not before the change before it
            at = max(c.t - c.notice_s, prev) if c.gpus < self._before(c) else c.t
            actions.append((at, c))
            prev = c.t
        self.upcoming = deque(actions)  # (when the job learns of it, the change); a policy may take one early
        while self.upcoming:
            at, c = self.upcoming.popleft()
            if at >= self.end:
                break
            if at > env.now:
                yield from self.train(env, at - env.now)
            while self.upcoming and self.upcoming[0][0] <= env.now:  # (came while the last one was handled)
                c = self.upcoming.popleft()[1]  # the controller merges its queue into one change: the last count
                self.out.merged += 1
            yield from self.policy.handle(self, env, c)
        yield from self.train(env, self.end - env.now)

    def _before(self, c: Change) -> int:
        prev = self._counts_before.get(c.t)
        return prev if prev is not None else c.gpus

    def run(self) -> Outcome:
        self._counts_before: dict[float, int] = {}
        self._place: dict[Change, int] = {}
        n = self.avail
        for i, c in enumerate(self.changes):
            self._counts_before[c.t] = n
            self._place.setdefault(c, i)
            n = c.gpus
        self.out.ideal_samples = self._ideal()
        env = simpy.Environment()
        env.process(self._job(env))
        env.run(until=self.end)
        return self.out

    def _ideal(self) -> float:
        t, n, total = 0.0, self.avail, 0.0
        for c in self.changes + [Change(self.end, 0)]:
            end = min(c.t, self.end)
            # (the fastest on at most n: not the controller's choice of exactly n, which can be slower)
            lay = target.fastest_up_to(self.adapter, self.job, n, self.hw)
            if lay is not None and end > t:
                total += (end - t) / self.step_s(lay) * self.job.train.global_batch
            t, n = end, c.gpus
            if t >= self.end:
                break
        return total


class Policy:
    name = "?"
    move: Move = LIVE  # how it gets to a configuration, as its target choice counts it

    def first(self, sim: Sim, gpus: int) -> Layout | None:
        return sim.best(gpus)

    def target(self, sim: Sim, gpus: int) -> Layout | None:
        return sim.best(gpus, self.move)

    def handle(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        """One change, from when the job learns of it (a loss with notice: the notice)."""
        raise NotImplementedError

    def wait_for_loss(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        """Train on until the GPUs of a loss are gone (its notice came first)."""
        if c.t > env.now:
            yield from sim.train(env, c.t - env.now)

    def untouched(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        """A loss of idle GPUs only: the job trains on."""
        yield from self.wait_for_loss(sim, env, c)
        sim.avail = c.gpus

    def idle_or_resume(self, sim: Sim, env: simpy.Environment, c: Change, old: Layout | None,
                       tgt: Layout | None) -> Iterator[Any]:
        """A change from or to GPUs on which no configuration fits, charged as the controller
        does it under every policy: to none, the job saves at the notice where the save ends
        before the GPUs go (its suspension), else it loses the work since the last periodic
        checkpoint; it idles until GPUs come back, then resumes from the checkpoint on storage
        (a start, its groups, the load: a restart without a save). A first start (nothing
        trained yet) is not charged, as the start at time 0 is not."""
        if old is not None:  # (and tgt is None: fewer GPUs than any configuration needs)
            save_s = costs.restart(sim.work, old.parallel, old.parallel, sim.prof).save_s
            saved = c.notice_s > 0 and env.now + save_s <= c.t
            if saved:
                yield from sim.pause(env, save_s)
                sim.checkpointed(env)
                sim.layout = None  # (idle from the save on)
            yield from self.wait_for_loss(sim, env, c)
            lost = 0.0 if saved else sim.roll_back()
            sim.avail, sim.layout = c.gpus, None
            sim.record(env, "suspend", lost_s=lost, saved=saved)
            return
        yield from self.wait_for_loss(sim, env, c)
        sim.avail = c.gpus
        if tgt is None:
            return
        trained = sim.out.useful_s > 0 or sim.out.lost_s > 0
        dt = costs.restart(sim.work, tgt.parallel, tgt.parallel, sim.prof, save=False).downtime_s if trained else 0.0
        yield from sim.pause(env, dt)
        sim.layout = tgt
        sim.record(env, "resume" if trained else "start", downtime_s=dt)


class Live(Policy):
    """LiveR: prepare beside training from the notice, switch in a pause of its downtime; a loss
    before Ready is a fail-stop, healed from replicas where the configuration has them."""

    name = "live"

    def handle(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        if (n := sim.usable(c)) is None:
            yield from self.untouched(sim, env, c)
            return
        old, tgt = sim.layout, self.target(sim, n)
        if old is None or tgt is None:
            yield from self.idle_or_resume(sim, env, c, old, tgt)
            return
        if tgt.parallel == old.parallel:
            sim.avail = c.gpus
            return
        h = self.handoff(sim, env, old.parallel, tgt.parallel, c)
        loss = c.gpus < sim.avail
        if not loss and (cut := self._notice_while_preparing(sim, env, h)) is not None:
            yield from self._cut_short(sim, env, c, cut)
            return
        if loss and env.now + h.prepare_s > c.t:  # not ready before the GPUs go
            yield from self.wait_for_loss(sim, env, c)
            yield from self.fail(sim, env, c, tgt, h)
            return
        yield from self.prepare(sim, env, h)
        yield from self.mirror(sim, env, h)
        yield from sim.pause(env, h.downtime_s)
        sim.avail, sim.layout = c.gpus, tgt
        sim.record(env, "live", downtime_s=h.downtime_s, prepare_s=h.prepare_s, transfer_s=h.transfer_s,
                   **({"mirror_cost_s": h.mirror_cost_s} if h.mirror_steps else {}))
        if loss:
            yield from self.wait_for_loss(sim, env, c)

    def handoff(self, sim: Sim, env: simpy.Environment, old: ParallelConfig, new: ParallelConfig,
                c: Change | None = None) -> costs.Live:
        """The handoff's costs (``costs.live``)."""
        return costs.live(sim.work, old, new, sim.prof)

    @staticmethod
    def prepare(sim: Sim, env: simpy.Environment, h: costs.Live) -> Iterator[Any]:
        """Training beside the preparation (slower by the steady overhead), then its stall of the
        steps (its groups' and connections')."""
        yield from sim.train(env, h.prepare_s, 1 - sim.overhead)
        yield from sim.train(env, h.stall_s, 0.0)

    @staticmethod
    def mirror_s(sim: Sim, h: costs.Live) -> float:
        """A pre-copy's stretch of training after Ready: its mirrored steps, each slowed by its extra."""
        return h.mirror_steps * (sim.step_s(sim.layout) + h.mirror_step_s) if h.mirror_steps else 0.0

    def mirror(self, sim: Sim, env: simpy.Environment, h: costs.Live) -> Iterator[Any]:
        """Training while a pre-copy mirrors (none here)."""
        dt = self.mirror_s(sim, h)
        if dt > 0:
            yield from sim.train(env, dt, 1 - h.mirror_cost_s / dt)

    @staticmethod
    def _notice_while_preparing(sim: Sim, env: simpy.Environment, h: costs.Live) -> tuple[float, Change] | None:
        """The next change, where it is a notice that comes before this scale-out is ready."""
        if not sim.upcoming:
            return None
        at, nxt = sim.upcoming[0]
        if nxt.notice_s > 0 and at < min(env.now + h.prepare_s, sim.end) and nxt.gpus < sim._before(nxt):
            return at, nxt
        return None

    def _cut_short(self, sim: Sim, env: simpy.Environment, c: Change, cut: tuple[float, Change]) -> Iterator[Any]:
        """A notice during a scale-out's Prepare, as the controller takes it
        (``liver.policy.decisions.on_notice``): nothing was committed, so the scale-out is
        re-planned to the notice's total (merged), or dropped and the notice handled next."""
        at, nxt = cut
        yield from sim.train(env, max(0.0, at - env.now), 1 - sim.overhead)  # preparing until the notice
        sim.avail = c.gpus
        left = sim.usable(nxt)  # (None: idle GPUs only; else the GPUs of its own the job has left)
        n = nxt.gpus if left is None else left
        action = on_notice(EventKind.SCALE_OUT, EventKind.SCALE_IN, n, sim.layout.size)
        if action is NoticeAction.DROP_THEN_BEGIN:  # the notice is the next change handled
            sim.record(env, "dropped", reason=f"notice to {nxt.gpus} GPUs")
            return
        sim.upcoming.popleft()  # the notice is taken here: merged, or nothing left to do
        if action is NoticeAction.DROP:
            yield from self.wait_for_loss(sim, env, nxt)
            sim.avail = nxt.gpus
            sim.record(env, "dropped", reason=f"notice to {nxt.gpus} GPUs, as many as the job has")
            return
        tgt = self.target(sim, n)
        if tgt is None or tgt.parallel == sim.layout.parallel:
            yield from self.wait_for_loss(sim, env, nxt)
            sim.avail = nxt.gpus
            return
        h = self.handoff(sim, env, sim.layout.parallel, tgt.parallel, nxt)
        yield from self.prepare(sim, env, h)  # a scale-out to fewer: prepared again
        yield from self.mirror(sim, env, h)
        yield from sim.pause(env, h.downtime_s)
        sim.layout = tgt
        sim.record(env, "live", downtime_s=h.downtime_s, prepare_s=h.prepare_s, transfer_s=h.transfer_s,
                   merged=True)
        yield from self.wait_for_loss(sim, env, nxt)
        sim.avail = nxt.gpus

    def fail(self, sim: Sim, env: simpy.Environment, c: Change, tgt: Layout, h: costs.Live) -> Iterator[Any]:
        old = sim.layout
        healed = sim.heals(old, old.size - sim.usable(c))
        if healed:  # the survivors hold a replica of every shard: healed, nothing rolled back
            dt = sim.prof.detect_s + h.groups_s + h.downtime_s
            lost = 0.0
        else:
            lost = sim.roll_back()
            tgt = sim.recovery(c, tgt)
            dt = sim.prof.detect_s + costs.restart(sim.work, old.parallel, tgt.parallel, sim.prof, save=False).downtime_s
        yield from sim.pause(env, dt)
        sim.avail, sim.layout = c.gpus, tgt
        sim.record(env, "fail-stop", downtime_s=dt, lost_s=lost, healed=healed)


class LivePrecopy(Live):
    """LiveR with pre-copy (``--precopy``): after Ready, what moves is copied beside training (to cold
    joiners too) and kept current by replaying each step's update, so the pause moves none of it; where a notice's window cannot hold the preparation and the copy, the handoff
    does without it (the controller's deadline does not wait for the slices)."""

    name = "live-precopy"

    def handoff(self, sim: Sim, env: simpy.Environment, old: ParallelConfig, new: ParallelConfig,
                c: Change | None = None) -> costs.Live:
        h = costs.live(sim.work, old, new, sim.prof, precopy=True)
        if c is not None and c.gpus < sim.avail and env.now + h.prepare_s + self.mirror_s(sim, h) > c.t:
            return super().handoff(sim, env, old, new, c)
        return h


class Restart(Policy):
    """Stop and restart through a checkpoint at every change (``memory``: the checkpoint in host
    memory, resharded over the network; else DCP on storage); at a notice it saves then restarts
    on the GPUs it will have; a save the loss cuts short falls back to the last periodic one."""

    name = "restart-storage"
    memory = False
    move = RestartMove()

    def handle(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        if (n := sim.usable(c)) is None:
            yield from self.untouched(sim, env, c)
            return
        old, tgt = sim.layout, self.target(sim, n)
        if old is None or tgt is None:
            yield from self.idle_or_resume(sim, env, c, old, tgt)
            return
        if tgt.parallel == old.parallel:
            yield from self.wait_for_loss(sim, env, c)
            sim.avail = c.gpus
            return
        r = costs.restart(sim.work, old.parallel, tgt.parallel, sim.prof, memory=self.memory)
        loss = c.gpus < sim.avail
        if loss and env.now + r.save_s > c.t:  # the save does not finish before the GPUs go
            yield from self.wait_for_loss(sim, env, c)
            lost = sim.roll_back()
            tgt = sim.recovery(c, tgt)
            r = costs.restart(sim.work, old.parallel, tgt.parallel, sim.prof, memory=self.memory, save=False)
            yield from sim.pause(env, sim.prof.detect_s + r.downtime_s)
            sim.avail, sim.layout = c.gpus, tgt
            sim.record(env, "fail-stop", downtime_s=sim.prof.detect_s + r.downtime_s, lost_s=lost)
            return
        yield from sim.pause(env, r.downtime_s)
        sim.checkpointed(env)
        sim.avail, sim.layout = c.gpus, tgt
        sim.record(env, "restart", downtime_s=r.downtime_s)
        if loss:
            yield from self.wait_for_loss(sim, env, c)


class RestartMemory(Restart):
    name = "restart-memory"
    memory = True
    move = RestartMove(memory=True)


class RestartPeriodic(Restart):
    """Megatron-LM's checkpoint baseline as the design runs it: a loss (with a notice or not)
    falls back to the last periodic checkpoint, the work since it lost, then restarts on the GPUs
    left; GPUs that come are taken by a save and a restart (the job picks that moment)."""

    name = "restart-periodic"
    move = RestartMove(save=False)  # (its losses: from the last periodic checkpoint)

    def handle(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        n = sim.usable(c)  # (the change's own draws: the same again in ``Restart.handle``)
        old, tgt = sim.layout, None if n is None else self.target(sim, n)
        if c.gpus >= sim.avail or n is None or old is None or tgt is None:  # (idle, or none fits: as Restart)
            yield from super().handle(sim, env, c)
            return
        yield from self.wait_for_loss(sim, env, c)
        lost = sim.roll_back()
        dt = sim.prof.detect_s + costs.restart(sim.work, old.parallel, tgt.parallel, sim.prof, save=False).downtime_s
        yield from sim.pause(env, dt)
        sim.avail, sim.layout = c.gpus, tgt
        sim.record(env, "fail-stop", downtime_s=dt, lost_s=lost)


class DataParallelOnly(Policy):
    """What torchft does: only the replicated dimension changes, live (a stall of its measured
    size, ``Profile.dp_join_stall_s`` and ``dp_kill_stall_s``, joiners healed from a peer over the
    network); TP and PP stay as they began; a count with no whole replica left idles until GPUs
    come back, and then restarts from the checkpoint."""

    name = "dp-only"

    def first(self, sim: Sim, gpus: int) -> Layout | None:
        """The most elastic start: the smallest TP x PP whose state fits (the most replicas to
        lose), the fastest of those on the most replicas the GPUs and the batch allow."""
        job, a = sim.job, sim.adapter
        for size in range(1, gpus + 1):
            pairs = {(c.tp, c.pp) for n in range(size, gpus + 1, size) for c in target.candidates(a, job, n)
                     if c.tp * c.pp == size and target.fits(a, job, c, sim.hw)}
            if pairs:
                opts = [lay for pair in sorted(pairs) if (lay := self._most(sim, gpus, pair)) is not None]
                lay = max(opts, key=lambda c: (c.size, -sim.step_s(c)))
                self.keep = (lay.tp, lay.pp)
                return lay
        self.keep = None
        return None

    def _most(self, sim: Sim, gpus: int, pair: tuple[int, int]) -> Layout | None:
        tp, pp = pair
        for dp in range(gpus // (tp * pp), 0, -1):
            lay = target.best(sim.adapter, sim.job, dp * tp * pp, sim.hw, keep_tp_pp=pair)
            if lay is not None:
                return lay
        return None

    def target(self, sim: Sim, gpus: int) -> Layout | None:
        """The most replicas the GPUs hold that the batch allows, TP and PP as they began."""
        if self.keep is None:
            return self.first(sim, gpus)
        return self._most(sim, gpus, self.keep)

    def handle(self, sim: Sim, env: simpy.Environment, c: Change) -> Iterator[Any]:
        if sim.usable(c) is None:
            yield from self.untouched(sim, env, c)
            return
        # (a replica that lost GPUs is started again by the scheduler on the GPUs there are, idle
        # ones included, as torchft's replica groups are: the most replicas on all of them)
        old, tgt = sim.layout, self.target(sim, c.gpus)
        yield from self.wait_for_loss(sim, env, c)
        if old is not None and tgt is not None and tgt.parallel == old.parallel:
            if c.gpus < sim.avail:  # one of its replicas lost GPUs: it leaves, then joins again, healed
                prof = sim.prof
                dt = (prof.dp_join_stall_s if c.notice_s > 0 else prof.dp_kill_stall_s) + prof.dp_join_stall_s \
                    + costs.rank_state_bytes(sim.work, tgt) / prof.inter_bw
                yield from sim.pause(env, dt)
                sim.record(env, "dp-replace", downtime_s=dt)
            sim.avail = c.gpus
            return
        if tgt is None:
            if old is not None:
                sim.roll_back()
            sim.avail, sim.layout = c.gpus, None
            sim.record(env, "idle")
            return
        if old is None:  # whole replicas again: from the checkpoint
            r = costs.restart(sim.work, tgt.parallel, tgt.parallel, sim.prof, save=False)
            yield from sim.pause(env, r.downtime_s)
            sim.avail, sim.layout = c.gpus, tgt
            sim.record(env, "restart", downtime_s=r.downtime_s)
            return
        prof = sim.prof
        if tgt.dp > old.dp:  # joiners healed from a live peer
            dt = prof.dp_join_stall_s + costs.rank_state_bytes(sim.work, tgt) / prof.inter_bw
        else:  # a replica leaves with a notice (it leaves the quorum as a joiner enters it), or dies
            dt = prof.dp_join_stall_s if c.notice_s > 0 else prof.dp_kill_stall_s
        yield from sim.pause(env, dt)
        sim.avail, sim.layout = c.gpus, tgt
        sim.record(env, "dp-resize", downtime_s=dt)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Live, LivePrecopy, Restart, RestartMemory, RestartPeriodic,
                                                          DataParallelOnly)}


def simulate(job: JobConfig, prof: Profile, policy: str, start_gpus: int, changes: list[Change], hours: float,
             **kw: Any) -> Outcome:
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: allowed {', '.join(POLICIES)}")
    return Sim(job, prof, POLICIES[policy](), start_gpus, changes, hours, **kw).run()
