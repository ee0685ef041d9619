"""What each phase costs, as functions of the model, the configurations and the profile.

A live handoff (``live``): its preparation beside training (a cold joiner's boot and mock
warm-up, the new communicators, growing with the ranks, the controller's plan, the Shadow World's
state) and its pause (the swap, the transfer of the busiest rank's bytes over its link, the first
step on the new generation). The bytes come from the project's own planner on the real layouts
(cached per pair of configurations). A restart (``restart``): save, process start, CUDA context,
rendezvous and communicators growing with the ranks, load with resharding, the rest; from storage
(DCP per rank, capped by the file system) or from memory (host copies, resharded over the network).
A step (``step_time``): a roofline at the profile's sustained share of the peak, with the pipeline
bubble, the TP all-reduces and the part of the gradient all-reduce not hidden by the backward pass.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from liver.sim.profile import GB, Profile
from liver.topology import JobConfig, Layout, ParallelConfig


def layout(job: JobConfig, par: ParallelConfig) -> Layout:
    return Layout(job.model, par, job.train, par.world_size)


def spans_nodes(ranks: int, prof: Profile) -> bool:
    return ranks > prof.node_size


def step_time(job: JobConfig, lay: Layout, prof: Profile) -> float:
    """A step's time: the roofline (compute at the sustained share of the peak with the pipeline
    bubble, TP and DP all-reduce bytes over their links) and, where the profile has them (CPU
    processes), the framework's per-layer time and the collectives' round trips along the
    critical path, all slowed by processes sharing cores."""
    m, t = job.model, job.train
    tokens = t.global_batch * m.seq_len
    devices = lay.size if prof.cores is None else min(lay.size, prof.cores)
    compute = 6 * m.num_params() * tokens / (prof.peak_flops * prof.mfu * devices)
    micro = lay.num_micro_batches
    bubble = (micro + lay.pp - 1) / micro
    path = (micro + lay.pp - 1) * m.num_layers / lay.pp  # layer micro-steps on the critical path
    share = 1.0 if prof.cores is None else max(1.0, lay.size / prof.cores)
    rounds = share * (prof.layer_op_s * path + prof.tp_latency_s * 4 * path * (lay.tp - 1)
                      + prof.dp_latency_s * (lay.dp - 1) * (m.num_layers / lay.pp + 2) + prof.p2p_latency_s * 2 * (micro + lay.pp - 1) * (lay.pp > 1)
                      + prof.step_fixed_s)
    act = t.micro_batch * m.seq_len * m.hidden_size * 2
    tp_bytes = 0.0 if lay.tp == 1 else 4 * m.num_layers / lay.pp * micro * act * 2 * (lay.tp - 1) / lay.tp
    tp_bw = prof.intra_bw if lay.tp <= prof.node_size else prof.inter_bw
    dp_bytes = 0.0 if lay.dp == 1 else 2 * (lay.dp - 1) / lay.dp * 2 * m.num_params() / (lay.tp * lay.pp)
    dp_bw = prof.intra_bw if not spans_nodes(lay.size, prof) else prof.inter_bw
    return compute * bubble + tp_bytes / tp_bw + (1 - prof.dp_overlap) * dp_bytes / dp_bw + rounds


def candidates(job: JobConfig, gpus: int) -> list[Layout]:
    out = []
    for tp in (1, 2, 4, 8, 16):
        if gpus % tp or job.model.num_heads % tp or job.model.ffn_size % tp:
            continue
        for pp in range(1, min(gpus // tp, job.model.num_layers) + 1):
            if (gpus // tp) % pp:
                continue
            try:
                out.append(layout(job, ParallelConfig(tp=tp, pp=pp, dp=gpus // (tp * pp))))
            except ValueError:
                continue
    return out


def best(job: JobConfig, gpus: int, prof: Profile, keep_tp_pp: tuple[int, int] | None = None) -> Layout | None:
    """The fastest configuration for ``gpus`` whose state fits with a quarter to spare (for
    activations), or None. ``keep_tp_pp``: only those with this TP and PP (data-parallel-only)."""
    fit = [c for c in candidates(job, gpus) if rank_state_bytes(job, c) * 1.25 <= prof.memory_bytes
           and (keep_tp_pp is None or (c.tp, c.pp) == keep_tp_pp)]
    return min(fit, key=lambda c: (step_time(job, c, prof), c.pp, c.tp), default=None)


@functools.lru_cache(maxsize=65536)
def best_up_to(job: JobConfig, gpus: int, prof: Profile) -> Layout | None:
    """The best configuration on the most of ``gpus`` that any configuration can use (a count the
    batch or the shapes do not divide leaves a few GPUs idle), or None."""
    for n in range(gpus, 0, -1):
        lay = best(job, n, prof)
        if lay is not None:
            return lay
    return None


def rank_state_bytes(job: JobConfig, lay: Layout) -> float:
    """A rank's training state (12 bytes a parameter: fp32 weights and two moments) and its
    compute copies (2 bytes a parameter): its TP x PP part, whole on every data-parallel replica
    (the reference engine's layout: no sharded optimizer)."""
    return job.model.num_params() * 14 / (lay.tp * lay.pp)


@functools.lru_cache(maxsize=4096)
def _plan(job: JobConfig, old: ParallelConfig, new: ParallelConfig, n_old: int, n_new: int) -> tuple[int, int]:
    from liver.engine.reference.trainer import state_specs
    from liver.planner.plan import plan_transfer

    procs = list(range(max(n_old, n_new)))
    p = plan_transfer(layout(job, old), layout(job, new), state_specs(job), procs[:n_old], procs[:n_new])
    return max(max(p.rank_bytes_in.values(), default=0), max(p.rank_bytes_out.values(), default=0)), p.bytes_moved


def moved(job: JobConfig, old: ParallelConfig, new: ParallelConfig) -> tuple[int, int]:
    """(the busiest rank's bytes in or out, every byte moved) of the planner's plan."""
    return _plan(job, old, new, old.world_size, new.world_size)


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


def groups_s(prof: Profile, ranks: int, joiners: bool) -> float:
    if not joiners:
        return 0.1  # a generation over the same processes shares their communicators
    return prof.group_init_s + prof.group_growth_s * max(0.0, math.log2(max(ranks, 2) / 2))


def live(job: JobConfig, old: ParallelConfig, new: ParallelConfig, prof: Profile,
         max_rank_bytes: int | None = None) -> Live:
    joiners = new.world_size > old.world_size
    if max_rank_bytes is None:
        max_rank_bytes = moved(job, old, new)[0]
    link = prof.inter_bw if spans_nodes(max(old.world_size, new.world_size), prof) else prof.intra_bw
    state_gb = rank_state_bytes(job, layout(job, new)) / GB
    params_per_rank = job.model.num_params() / new.world_size / 1e9
    build = prof.prepare_joiner_s if joiners else \
        prof.prepare_base_s + prof.prepare_s_per_gb * state_gb + prof.prepare_s_per_moved_gb * max_rank_bytes / GB
    return Live(boot_s=prof.joiner_boot_s if joiners else 0.0,
                mock_s=prof.mock_s_per_gparam * params_per_rank if joiners else 0.0,
                groups_s=groups_s(prof, new.world_size, joiners),
                plan_s=prof.plan_s_per_krank * max(old.world_size, new.world_size) / 1000,
                build_s=max(0.0, build), switch_s=prof.switch_fixed_s, transfer_s=max_rank_bytes / link,
                first_step_s=prof.first_step_s if max_rank_bytes else 0.0)


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


def restart(job: JobConfig, old: ParallelConfig, new: ParallelConfig, prof: Profile, memory: bool = False,
            fresh: bool = True, save: bool = True) -> Restart:
    """Stop, save (unless ``save`` is False: a periodic checkpoint is reloaded), start the new
    processes (fresh interpreters, or forked: ``fresh``), their groups, load with resharding.
    ``memory``: the checkpoint is in host memory (the snapshot taken beside training, the load
    from host memory, the reshard over the network)."""
    total = job.model.num_params() * 12
    n_old, n_new = old.world_size, new.world_size
    if memory:
        save_s = total / n_old / prof.host_bw if save else 0.0
        reshard = moved(job, old, new)[0] / (prof.inter_bw if spans_nodes(max(n_old, n_new), prof) else prof.intra_bw)
        load_s = total / n_new / prof.host_bw + reshard
    else:
        save_s = prof.save_fixed_s + total / min(n_old * prof.save_bw_per_rank, prof.storage_cap_bw) if save else 0.0
        load_s = prof.load_fixed_s + total / min(n_new * prof.load_bw_per_rank, prof.storage_cap_bw)
    start_s = (prof.process_start_s if fresh else 0.0) + prof.cuda_init_s
    init_s = prof.rendezvous_s_per_rank * n_new + groups_s(prof, n_new, joiners=True)
    return Restart(save_s=save_s, start_s=start_s, init_s=init_s, load_s=load_s, fixed_s=prof.restart_fixed_s)
