"""What each phase costs, as functions of the model, the configurations and the profile.

A live handoff (``live``): its preparation beside training (a cold joiner's boot and mock
warm-up, the new communicators, growing with the ranks, the controller's plan, and the companion's
paced work per transfer task of the busiest process) and its pause (the swap, the busiest process's
sends and receives over its link with its local copies beside them, the first step on the new
generation with NCCL's connection of the collectives it runs over new process sets). The work
comes from the project's own planner on the real layouts (``plan_work``, cached per pair of
configurations). A restart (``restart``): save, process start, CUDA context, rendezvous and
communicators growing with the ranks, load with resharding (``dcp_bytes``: what DCP writes and
reads), the rest; from storage (capped by the file system) or from memory (host copies, resharded
over the network). A step (``step_time``): a roofline at the profile's sustained share of the
peak, with the pipeline bubble, the TP all-reduces and the part of the gradient all-reduce not
hidden by the backward pass.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from liver.policy.profile import GB, Profile
from liver.policy.workload import Workload
from liver.runtime.config import PrepareConfig
from liver.topology import Layout, ParallelConfig


def layout(job: Workload, par: ParallelConfig) -> Layout:
    return job.layout(par)


def spans_nodes(ranks: int, prof: Profile) -> bool:
    return ranks > prof.node_size


def crowding(cores: int | None, procs: int) -> float:
    """How much slower a process's own work runs where ``procs`` processes share a host's
    ``cores`` (CPU processes, a profile's ``cores``: each gets its share of them; None, a GPU
    each: 1)."""
    return 1.0 if cores is None else max(1.0, procs / cores)


def step_floor(job: Workload, gpus: int, prof: Profile) -> float:
    """No layout of ``gpus`` GPUs steps faster than this: ``step_time``'s compute alone, at the
    widest TP rank's sustained share, with no bubble and even stages."""
    m, t = job.facts, job.train
    devices = gpus if prof.cores is None else min(gpus, prof.cores)
    return 6 * m.params * t.global_batch * m.seq_len / (prof.peak_flops * sustained(prof, m.width) * devices)


def stage_layers(lay: Layout) -> int:
    """The layers of the pipeline's fullest stage: every stage waits for it (40 layers on 28
    stages run at two layers a stage, not 1.4)."""
    return max(lay.layers_per_stage)


def paced_layers(lay: Layout, cores: int | None) -> float:
    """The layers a stage's work counts as, as the step's critical path runs them: where each
    process has a device of its own (GPUs, ``cores`` None, or no more CPU processes than
    ``cores``), the fullest stage's; where processes share cores, their work is pooled on them:
    the stages' mean."""
    return stage_layers(lay) if cores is None or lay.size <= cores else lay.layers / lay.pp


def pace(lay: Layout, cores: int | None) -> float:
    """How much the fullest stage slows the compute against an even split (1: even, or pooled)."""
    return paced_layers(lay, cores) * lay.pp / lay.layers


def sustained(prof: Profile, width: float) -> float:
    """The share of the peak a GPU sustains on matrix multiplies ``width`` wide (a TP rank's share
    of the hidden size): narrower ones do less work per byte they read."""
    return prof.mfu * width / (width + prof.mfu_width)


def step_time(job: Workload, lay: Layout, prof: Profile) -> float:
    """A step's time (``job``: the job as its engine trains it): the roofline (compute at the share of the peak sustained at its TP rank's
    width, at the pace of the pipeline's fullest stage, with the bubble, TP and DP all-reduce bytes over their links) and, where the profile has them (CPU
    processes), the framework's per-layer time and the collectives' round trips along the
    critical path, all slowed by processes sharing cores."""
    m, t = job.facts, job.train
    tokens = t.global_batch * m.seq_len
    devices = lay.size if prof.cores is None else min(lay.size, prof.cores)
    compute = 6 * m.params * tokens / (prof.peak_flops * sustained(prof, m.width / lay.tp) * devices) * pace(lay, prof.cores)
    micro = lay.num_micro_batches
    bubble = (micro + lay.pp - 1) / micro
    stage = paced_layers(lay, prof.cores)
    path = (micro + lay.pp - 1) * stage  # layer micro-steps on the critical path
    rounds = crowding(prof.cores, lay.size) * (
        prof.layer_op_s * path + prof.tp_latency_s * 4 * path * (lay.tp - 1)
        + prof.dp_latency_s * (lay.dp - 1) * (stage + 2)
        + prof.p2p_latency_s * 2 * (micro + lay.pp - 1) * (lay.pp > 1) + prof.step_fixed_s)
    act = t.micro_batch * m.seq_len * m.width * 2
    tp_bytes = 0.0 if lay.tp == 1 else 4 * stage * micro * act * 2 * (lay.tp - 1) / lay.tp
    tp_bw = prof.intra_bw if lay.tp <= prof.node_size else prof.inter_bw
    dp_bytes = 0.0 if lay.dp == 1 else 2 * (lay.dp - 1) / lay.dp * 2 * m.params * pace(lay, prof.cores) / (lay.tp * lay.pp)
    dp_bw = prof.intra_bw if not spans_nodes(lay.size, prof) else prof.inter_bw
    return compute * bubble + tp_bytes / tp_bw + (1 - prof.dp_overlap) * dp_bytes / dp_bw + rounds


def rank_state_bytes(job: Workload, lay: Layout) -> float:
    """The fullest rank's training state (12 bytes a parameter: fp32 weights and two moments) and
    its compute copies (2 bytes a parameter): its TP part of the fullest stage, whole on every
    data-parallel replica (the reference engine's layout: no sharded optimizer)."""
    return job.facts.params * 14 * stage_layers(lay) / (lay.tp * lay.layers)


@dataclass(frozen=True)
class Work:
    """What a transfer plan asks of its busiest processes."""

    io_bytes: int    # the most bytes one process sends and receives, together: NCCL's sends and
                     # receives of one process share its copy engines and SMs (measured on a pair of
                     # H200s: 6.17 GB each way at once took 1.7x as long as 6.17 GB one way)
    copy_bytes: int  # the most bytes one process copies within its own memory (a shard that stays
                     # on the process in another box)
    tasks: int       # the most tasks one process takes part in (its companion's paced work: which
                     # slice goes in which message, its staging)
    moved: int       # every byte sent


def work(plan, part: str = "all") -> Work:
    """``Work`` of a ``liver.planner.plan.Plan``: all of it, or a pre-copy's parts
    (liver/transfer/precopy.py, without its memory cap: every process of a handoff follows the
    steps, cold joiners too): ``"mirrored"``, the tasks that move, ``"rest"``, the others (what the
    switch still moves: nothing)."""
    if part not in ("all", "mirrored", "rest"):
        raise ValueError(f"part={part!r}: allowed 'all', 'mirrored', 'rest'")
    import numpy as np

    nproc = max([*plan.placement, *plan.old_procs, 0]) + 1
    same_of: dict[int, np.ndarray] = {}  # the planner shares a cross list among columns of one geometry
    cols = [c for layer in plan.by_layer.values() for c in layer if len(c.row)]
    for c in cols:
        if id(c.cross) not in same_of:
            same_of[id(c.cross)] = np.array([x[5] for x in c.cross], dtype=bool)
    if cols:
        src = np.concatenate([c.src_proc for c in cols])
        dst = np.concatenate([c.dst_proc for c in cols])
        nbytes = np.concatenate([c.nbytes for c in cols]).astype(np.float64)
        same = np.concatenate([same_of[id(c.cross)][c.row] for c in cols])
    else:
        src = dst = np.zeros(0, dtype=np.int64)
        nbytes, same = np.zeros(0), np.zeros(0, dtype=bool)
    local = src == dst
    if part != "all":
        mirrored = ~(local & same)
        keep = mirrored if part == "mirrored" else ~mirrored
        src, dst, nbytes, same, local = src[keep], dst[keep], nbytes[keep], same[keep], local[keep]

    def per_proc(procs: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(procs, weights=weights, minlength=nproc)

    io = per_proc(src[~local], nbytes[~local]) + per_proc(dst[~local], nbytes[~local])
    copy = per_proc(dst[local & ~same], nbytes[local & ~same])
    tasks = per_proc(src) + per_proc(dst[~local])  # a task is work for its source and its destination (once where one)
    moved = plan.bytes_moved if part == "all" else int(nbytes[~local].sum())
    return Work(int(io.max(initial=0)), int(copy.max(initial=0)), int(tasks.max(initial=0)), moved)


@functools.lru_cache(maxsize=4096)
def plan_work(job: Workload, old: ParallelConfig, new: ParallelConfig, part: str = "all",
              chosen_leaving: bool = False) -> Work:
    """``work`` of the planner's plan from ``old`` to ``new`` (survivors keep their ranks), over
    the engine's tensors in its analytic view (each sharded dimension cut evenly). In a scale-in
    the last ranks leave (a node lost: its ranks), or with ``chosen_leaving`` (a scale-in that
    names no node) those the controller chooses (``policy/leaving.py``: whole replicas where
    the others hold every shard, and then nothing moves; else the fewest bytes)."""
    from liver.planner.plan import plan_transfer

    lo, ln, specs = job.layout(old), job.layout(new), job.specs()
    procs = list(range(max(old.world_size, new.world_size)))
    olds, stay = procs[:old.world_size], procs[:new.world_size]
    if chosen_leaving and new.world_size < old.world_size:
        from liver.policy.leaving import choose_leaving

        gone = choose_leaving(lo, olds, old.world_size - new.world_size, specs, lambda p: p,
                              lambda kept: plan_transfer(lo, ln, specs, olds, kept).bytes_moved).procs
        stay = [p for p in olds if p not in gone]
    return work(plan_transfer(lo, ln, specs, olds, stay), part)


KINDS = ("tp", "dp", "pp")  # the collectives of a step: TP all-reduces, the gradient all-reduce, stage sends


@functools.lru_cache(maxsize=4096)
def collective_groups(lay: Layout) -> dict[str, frozenset[frozenset[int]]]:
    """The process sets each kind of collective runs over (ranks of ``lay``; a set of one runs none)."""
    tp, dp, pp = lay.tp, lay.dp, lay.pp  # rank = (pp * dp + d) * tp + t (Layout.coord)
    stage = tp * dp
    groups = {"tp": [range(b, b + tp) for b in range(0, lay.size, tp)] if tp > 1 else [],
              "dp": [range(p * stage + t, (p + 1) * stage, tp) for p in range(pp) for t in range(tp)] if dp > 1 else [],
              "pp": [range(d * tp + t, lay.size, stage) for d in range(dp) for t in range(tp)] if pp > 1 else []}
    return {k: frozenset(frozenset(g) for g in v) for k, v in groups.items()}


def first_uses(job: Workload, old: ParallelConfig, new: ParallelConfig) -> frozenset[str]:
    """The kinds of collective the new generation runs over a process set that did not run that
    kind before it (the survivors keep their ranks, joiners come after them): NCCL connects a
    communicator's channels for a kind of collective at its first use, in the first step."""
    was, now = collective_groups(layout(job, old)), collective_groups(layout(job, new))
    return frozenset(k for k in KINDS if now[k] - was[k])


def connect_s(prof: Profile, kinds: frozenset[str]) -> float:
    """The first step's connection of ``kinds`` (a pipeline's sends cost as the TP all-reduces:
    small messages; two GPUs of one host show no pipeline handoff)."""
    return (prof.connect_tp_s if kinds & {"tp", "pp"} else 0.0) + (prof.connect_dp_s if "dp" in kinds else 0.0)


def transfer_link(prof: Profile, procs: int) -> float:
    """The rate a handoff's transfer moves its busiest process's bytes at, sent and received
    together, over its processes' link (between nodes where they span several): its share of the
    link's one-way rate."""
    return (prof.inter_bw if spans_nodes(procs, prof) else prof.intra_bw) * prof.transfer_share


def transfer_s(w: Work, link: float, copy_bw: float, connect: float = 0.0) -> float:
    """The busiest process's sends and receives over its link, its local copies beside them (the
    executor overlaps the two), and ``connect``: a joiner's first send over its new communicator."""
    return max(w.io_bytes / link, w.copy_bytes / copy_bw) + (connect if w.io_bytes else 0.0)


@dataclass(frozen=True)
class Live:
    boot_s: float
    mock_s: float
    groups_s: float
    plan_s: float
    build_s: float
    switch_s: float
    transfer_s: float
    first_step_s: float

    @property
    def prepare_s(self) -> float:
        """From the event to Ready, beside training."""
        return self.boot_s + self.mock_s + self.groups_s + self.plan_s + self.build_s

    @property
    def downtime_s(self) -> float:
        return self.switch_s + self.transfer_s + self.first_step_s

    # a pre-copy (``precopy``): its copy beside training after Ready, and its steps that mirror
    precopy_s: float = 0.0      # the mirrored state's copy, one slice of layers a step, beside training
    mirror_steps: int = 0       # steps that replay their update on the copies (the slices, and one)
    mirror_step_s: float = 0.0  # what each of them adds: the gradients of the mirrored boxes sent, the update replayed
    stall_s: float = 0.0        # training time the preparation stalls beside it (measured, by whether joiners come)

    @property
    def mirror_cost_s(self) -> float:
        """Training time a pre-copy costs in all: its steps' extra."""
        return self.mirror_steps * self.mirror_step_s


SHARED_GROUPS_S = 0.1  # a generation over the same processes shares their communicators (measured: 0.09-0.11 s)


def growth_s(prof: Profile, ranks: int) -> float:
    """Communicator set-up beyond two ranks' (it grows with the doublings of the ranks)."""
    return prof.group_growth_s * max(0.0, math.log2(max(ranks, 2) / 2))


def groups_s(prof: Profile, ranks: int, joiners: bool) -> float:
    """A live handoff's new groups, beside training (the communicators' set-up, as a restart's)."""
    return prof.group_init_s + growth_s(prof, ranks) if joiners else SHARED_GROUPS_S


def live(job: Workload, old: ParallelConfig, new: ParallelConfig, prof: Profile,
         plan: Work | None = None, kinds: frozenset[str] | None = None, first_nccl: bool = False,
         share: float = PrepareConfig().companion_share, precopy: bool = False) -> Live:
    """A live handoff. ``plan``: the work of the plan it runs (``work``; by default the planner's
    with survivors keeping their ranks). Its build is paced (runtime/pace.py): the companion's CPU
    work, per transfer task of the busiest process, at ``share`` of each step (0: no limit), so it
    takes that work over ``share`` in wall time whatever the step time. ``kinds``: the collectives whose first use the first step pays (by default
    those ``first_uses`` finds; a run's history can say fewer: a communicator that ran a kind in
    an earlier generation). ``first_nccl``: the processes had never run an NCCL collective (a
    job that ran on one GPU until now). ``precopy``: what moves is copied after Ready (to cold
    joiners too: they follow the steps), a slice of ``PrepareConfig().precopy_slice_mib`` a step beside training,
    and kept current by sending each step the gradients of those boxes (the parameters' share of
    the state) and replaying the update (a pass over the copies at the device's copy bandwidth,
    reading and writing each byte: twice); the switch moves the rest. Where processes share
    cores (``crowding``), the build, the switch, the transfer and the first step take longer."""
    joiners = new.world_size > old.world_size
    c = crowding(prof.cores, max(old.world_size, new.world_size))
    w = plan or plan_work(job, old, new)
    if kinds is None:
        kinds = first_uses(job, old, new)
    link = transfer_link(prof, max(old.world_size, new.world_size))
    state_gb = rank_state_bytes(job, layout(job, new)) / GB
    params_per_rank = job.facts.params / new.world_size / 1e9
    paced = prof.prepare_cpu_s_per_task * w.tasks / share if share > 0 else 0.0
    build = (prof.prepare_joiner_s if joiners else prof.prepare_base_s) + paced
    mirror = {}
    if precopy:
        m = plan_work(job, old, new, "mirrored")
        w = plan_work(job, old, new, "rest")
        if m.io_bytes or m.copy_bytes:
            mirror = _mirror(job, m, step_time(job, layout(job, old), prof), link, prof.copy_bw)
    return Live(**mirror, stall_s=prof.prepare_stall_joiner_s if joiners else prof.prepare_stall_s,
                boot_s=prof.joiner_boot_s + prof.cuda_context_s if joiners else 0.0,
                mock_s=prof.mock_s_per_gparam * params_per_rank if joiners else 0.0,
                groups_s=groups_s(prof, new.world_size, joiners),
                plan_s=prof.plan_s_per_krank * max(old.world_size, new.world_size) / 1000,
                build_s=c * max(0.0, build), switch_s=c * (prof.switch_fixed_s + prof.switch_s_per_gb * state_gb),
                transfer_s=c * transfer_s(w, link, prof.copy_bw, prof.connect_p2p_s if joiners else 0.0),
                first_step_s=c * (prof.first_step_s + connect_s(prof, kinds) + (prof.nccl_first_s if first_nccl else 0.0)))


def _mirror(job: Workload, m: Work, step_s: float, link: float, copy_bw: float) -> dict[str, float]:
    """A pre-copy of ``m`` (the mirrored part of a plan) beside steps of ``step_s``: one slice a
    step (``PrepareConfig().precopy_slice_mib`` for the busiest process; 0: one slice), each copied
    while the step computes (what is left of its copy, the update waits for); each of those steps
    sends the gradients of the slices mirrored so far, its own among them (the parameters' share
    of their bytes), and replays the update on them (a pass over them at ``copy_bw``, each byte
    read and written), in the step (runtime/mirror.py); the switch follows the last."""
    specs = job.specs()
    grads = sum(s.nbytes for s in specs if s.kind == "param") / sum(s.nbytes for s in specs)
    slice_mib = PrepareConfig().precopy_slice_mib
    slices = max(1, math.ceil(max(m.io_bytes, m.copy_bytes) / (slice_mib << 20))) if slice_mib else 1
    copy = transfer_s(m, link, copy_bw)
    wait = max(0.0, copy / slices - step_s)
    full = m.io_bytes * grads / link + 2 * max(m.io_bytes, m.copy_bytes) / copy_bw  # every slice mirrored
    cost = slices * wait + full * (slices + 1) / 2  # the k-th step mirrors k/slices of it
    return {"precopy_s": copy, "mirror_steps": slices, "mirror_step_s": cost / slices}


@functools.lru_cache(maxsize=4096)
def _by_stage(job: Workload, lay: Layout) -> tuple[list[float], list[dict[int, float]]]:
    """Each stage's bytes of tensors no rank cuts, and of those TP cuts, by the length of the
    cut dimension (the tensors of one length are cut alike)."""
    whole = [0.0] * lay.pp
    cut: list[dict[int, float]] = [{} for _ in range(lay.pp)]
    for s in job.specs():
        st = lay.stage_of_layer(s.layer)
        if s.shard_dim is None:
            whole[st] += s.nbytes
        else:
            n = s.shape[s.shard_dim]
            cut[st][n] = cut[st].get(n, 0.0) + s.nbytes
    return whole, cut


@functools.lru_cache(maxsize=4096)
def dcp_bytes(job: Workload, old: ParallelConfig, new: ParallelConfig) -> tuple[float, float, float]:
    """What a DCP checkpoint of ``old`` loaded into ``new`` moves through storage: (the busiest
    old rank's bytes written, the busiest new rank's bytes read, all the new ranks' bytes read).
    A save writes each distinct shard once, spread over the replicas that hold it (DCP's
    deduplication); a load reads every saved chunk that overlaps a rank's shard whole and narrows
    it in memory (DCP's file system reader), so a rank whose TP slices cut across the saved ones
    reads more than it keeps, and every data-parallel replica reads its part."""
    lo, ln = layout(job, old), layout(job, new)
    whole_o, cut_o = _by_stage(job, lo)
    whole_n, cut_n = _by_stage(job, ln)
    write = max(whole_o[st] + sum(cut_o[st].values()) / lo.tp for st in range(lo.pp)) / lo.dp

    def read(stage: int, tp: int) -> float:
        """New rank (``stage``, ``tp``)'s bytes: its whole tensors, and of each cut one every saved
        TP slice its own slice overlaps."""
        total = whole_n[stage]
        for n, nbytes in cut_n[stage].items():
            mine, theirs = n // ln.tp, n // lo.tp
            first, last = tp * mine // theirs, ((tp + 1) * mine - 1) // theirs
            total += (last - first + 1) * nbytes / lo.tp
        return total

    reads = [read(st, t) for st in range(ln.pp) for t in range(ln.tp)]
    return write, max(reads), sum(reads) * ln.dp


def shared_storage_s(prof: Profile, nbytes: float, gpus: int) -> float:
    """``nbytes`` through the file system the nodes of a job of ``gpus`` share, at its share of
    it (``storage_bw_per_gpu`` a GPU); a job on one host uses its own storage (0 here: its rate
    is the host's, ``host_read_bw``, and its ranks' own)."""
    return nbytes / (prof.storage_bw_per_gpu * gpus) if spans_nodes(gpus, prof) else 0.0


@dataclass(frozen=True)
class Restart:
    save_s: float
    start_s: float
    init_s: float
    load_s: float
    fixed_s: float

    @property
    def downtime_s(self) -> float:
        return self.save_s + self.start_s + self.init_s + self.load_s + self.fixed_s


def restart(job: Workload, old: ParallelConfig, new: ParallelConfig, prof: Profile, memory: bool = False,
            fresh: bool = True, save: bool = True) -> Restart:
    """Stop, save (unless ``save`` is False: a periodic checkpoint is reloaded), start the new
    processes (fresh interpreters, or forked: ``fresh``), their groups, load with resharding
    (``dcp_bytes``), the first step. ``memory``: the checkpoint is in host memory (the snapshot
    taken beside training, the load from host memory, the reshard over the network). A host's new
    processes start together and read from its storage together (``host_start_growth``,
    ``host_read_bw``, measured by ``liver bench host-start``); where processes share cores
    (``crowding``), each part takes longer (the save by the old processes, the rest by the new)."""
    total = job.facts.params * 12
    n_old, n_new = old.world_size, new.world_size
    host = min(prof.node_size, n_new)  # the new processes of one host, starting and reading together
    if memory:
        save_s = total / n_old / prof.host_bw if save else 0.0
        reshard = plan_work(job, old, new).io_bytes / transfer_link(prof, max(n_old, n_new))
        load_s = total / n_new / prof.host_bw + reshard
    else:
        write, read, read_all = dcp_bytes(job, old, new)
        # a rank's own rate, its host's storage shared by its processes, and for a job of several nodes
        # (its checkpoint on the file system they share) the job's share of that file system's
        save_s = prof.save_fixed_s + max(write / prof.save_bw_per_rank, shared_storage_s(prof, total, n_old)) \
            if save else 0.0
        host_read = host * read / prof.host_read_bw if prof.host_read_bw > 0 else 0.0
        load_s = prof.load_fixed_s + max(read / prof.load_bw_per_rank, host_read,
                                         shared_storage_s(prof, read_all, n_new))
    start_s = (prof.process_start_s * (1 + prof.host_start_growth * max(0, host - 2)) if fresh
               else prof.cuda_context_s) + prof.cuda_init_s
    init_s = 0.0 if n_new == 1 else prof.rendezvous_s_per_rank * n_new + prof.group_init_s + growth_s(prof, n_new)
    fixed = prof.restart_fixed_s + prof.restart_s_per_gb * rank_state_bytes(job, layout(job, new)) / GB
    c = crowding(prof.cores, n_new)
    return Restart(save_s=crowding(prof.cores, n_old) * save_s, start_s=c * start_s, init_s=c * init_s, load_s=c * load_s,
                   fixed_s=c * fixed)
