"""Streaming executor across real processes over gloo: destination shards bit for bit, for TP,
PP (uneven), DP changes, scale-out, scale-in and combinations; staging stays within the budget."""

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.distributed as dist

from liver.engine.reference.trainer import state_specs
from liver.planner import plan_transfer
from liver.resource_view import view
from liver.resource_view.view import local_shape
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig
from liver.transfer import StreamingExecutor
from liver.transfer.check import reference_shard
from liver.world.group import Group
from liver.world.world import connect_store

MODEL = ModelConfig(num_layers=4, hidden_size=32, num_heads=4, ffn_size=64, vocab_size=256, vocab_multiple=64)
TRAIN = TrainConfig(global_batch=12, micro_batch=1)
JOB = JobConfig(model=MODEL, train=TRAIN)


def _transfer_group(store_addr, namespace, old_procs, new_procs, rank):
    """The group over every process of both sides, as the companion builds it."""
    store = dist.PrefixStore(namespace + "/", connect_store(store_addr))
    members = sorted(set(old_procs) | set(new_procs))
    return Group.create(store, "transfer", members, rank, "gloo", torch.device("cpu"), timeout=timedelta(seconds=60))


def _reference_state(specs, box_of, old_procs, rank):
    """This process's old shards with reference contents (None where it holds no old rank)."""
    if rank not in old_procs:
        return None
    r = old_procs.index(rank)
    return {s.name: reference_shard(s, b, torch.device("cpu")) for s in specs if (b := box_of(s, r)) is not None}


def transfer_case(*, store_addr, namespace, rank, old, new, old_procs, new_procs, budget, job=JOB,
                  placement=None, release=False, message_bytes=None, prealloc=False):
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    MODEL, TRAIN = job.model, job.train
    old_l, new_l = Layout(MODEL.num_layers, ParallelConfig.from_dict(old), TRAIN), Layout(MODEL.num_layers, ParallelConfig.from_dict(new), TRAIN)
    specs = state_specs(job)
    plan = plan_transfer(old_l, new_l, specs, old_procs, new_procs, placement=placement)
    group = _transfer_group(store_addr, namespace, old_procs, new_procs, rank)
    src = _reference_state(specs, lambda s, r: view(s, old_l, r), old_procs, rank)
    old_bytes = sum(t.numel() * t.element_size() for t in (src or {}).values())
    into = None
    if prealloc and rank in plan.placement:  # a joiner's warm-up storage, written in place
        r = plan.placement.index(rank)
        into = {s.name: torch.full(local_shape(view(s, new_l, r)), float("nan")) for s in specs
                if view(s, new_l, r) is not None}
    executor = StreamingExecutor(plan, specs, rank, group, budget, cpu, message_bytes=message_bytes)
    dst, stats = executor.run(src, release=release, into=into)
    if into is not None:
        assert all(dst[n] is t for n, t in into.items() if n in dst and (src is None or dst[n] is not src.get(n)))
    bad, expected_names = [], set()
    if rank in plan.placement:
        r = plan.placement.index(rank)
        for s in specs:
            box = view(s, new_l, r)
            if box is None:
                continue
            expected_names.add(s.name)
            if s.name not in dst or not torch.equal(dst[s.name], reference_shard(s, box, cpu)):
                bad.append(s.name)
    return {"bad": bad, "extra": sorted(set(dst) - expected_names), "stats": stats.to_dict(),
            "moved": plan.bytes_moved, "old_bytes": old_bytes, "left_over": sorted(src or {}),
            "new_bytes": sum(t.numel() * t.element_size() for t in dst.values())}


P = ParallelConfig
CASES = [
    ("tp2dp2->tp4 in place", P(tp=2, dp=2), P(tp=4), [0, 1, 2, 3], [0, 1, 2, 3]),
    ("tp4->tp1dp2pp2 in place", P(tp=4), P(pp=2, dp=2), [0, 1, 2, 3], [0, 1, 2, 3]),
    ("pp2[3,1]->pp3[1,1,2] scale-out", P(pp=2, layers_per_stage=(3, 1)), P(pp=3, layers_per_stage=(1, 1, 2)), [0, 1], [0, 1, 2]),
    ("dp2->dp4 scale-out", P(dp=2), P(dp=4), [0, 1], [0, 1, 2, 3]),
    ("tp2pp2dp2->tp1pp2 scale-in", P(tp=2, pp=2, dp=2), P(pp=2), list(range(8)), [5, 2]),
    ("tp2pp2->tp1dp3 join and leave", P(tp=2, pp=2), P(dp=3), [0, 1, 2, 3], [2, 3, 4]),
    ("tp1pp4->tp2pp2dp2 scale-out", P(pp=4), P(tp=2, pp=2, dp=2), [3, 2, 1, 0], list(range(8))),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,old,new,old_procs,new_procs", CASES, ids=[c[0] for c in CASES])
def test_streamed_shards_are_bit_exact(pool, name, old, new, old_procs, new_procs):
    n = len(set(old_procs) | set(new_procs))
    out = pool.run(transfer_case, [dict(rank=r, old=old.to_dict(), new=new.to_dict(), old_procs=old_procs,
                                        new_procs=new_procs, budget=64 << 20) for r in range(n)])
    for r, o in enumerate(out):
        assert o["bad"] == [] and o["extra"] == [], (r, o)
    assert sum(o["stats"]["bytes_received"] for o in out) == out[0]["moved"]
    assert sum(o["stats"]["bytes_sent"] for o in out) == out[0]["moved"]


@pytest.mark.timeout(300)
def test_staging_stays_within_a_budget_smaller_than_a_layer(pool):
    """TP1 -> TP4 slices every row-parallel weight across its inner dimension: staging is needed."""
    budget = 4096  # one layer's state is about 150 KB
    old, new = P(pp=2), P(tp=4)
    layer_bytes = sum(s.nbytes for s in state_specs(JOB) if s.layer == 0)
    assert budget < layer_bytes
    out = pool.run(transfer_case, [dict(rank=r, old=old.to_dict(), new=new.to_dict(), old_procs=[0, 1],
                                        new_procs=[0, 1, 2, 3], budget=budget) for r in range(4)])
    for o in out:
        assert o["bad"] == []
        assert o["stats"]["peak_staging_bytes"] <= budget
    assert max(o["stats"]["peak_staging_bytes"] for o in out) > 0


@pytest.mark.timeout(300)
def test_one_message_in_flight_into_preallocated_storage_is_bit_exact(pool):
    """Messages of the whole budget (no packing overlap) and a tiny budget, written into storage
    allocated beforehand (a joiner's case)."""
    old, new, old_procs, new_procs = P(pp=4), P(tp=2, pp=2, dp=2), [3, 2, 1, 0], list(range(8))
    out = pool.run(transfer_case, [dict(rank=r, old=old.to_dict(), new=new.to_dict(), old_procs=old_procs,
                                        new_procs=new_procs, budget=4096, message_bytes=4096, prealloc=True)
                                   for r in range(8)])
    for r, o in enumerate(out):
        assert o["bad"] == [] and o["extra"] == [], (r, o)
        assert o["stats"]["peak_staging_bytes"] <= 4096


def test_message_size_outside_the_budget_is_refused():
    # checked before the plan is even looked at
    with pytest.raises(ValueError, match="message_bytes=8192: allowed 1 to budget_bytes=4096"):
        StreamingExecutor(None, [], 0, None, 4096, torch.device("cpu"), message_bytes=8192)


def test_budget_smaller_than_a_row_is_refused():
    from liver.transfer.executor import _row_chunks
    with pytest.raises(ValueError, match="budget=10"):
        _row_chunks(((0, 4), (0, 8)), 32, 10)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("old,new", [(P(tp=2), P(dp=2)), (P(dp=2), P(tp=2))], ids=["tp2->dp2", "dp2->tp2"])
def test_released_sources_bound_old_plus_new_state(pool, old, new):
    """In place on the same two processes: releasing each layer's old shards once its operations
    completed keeps old + new state within the larger of the two plus a few layers, where keeping
    them all would hold both. (Not for every plan: two processes that swap whole pipeline stages
    walk one global layer order, so one of them receives before it has sent.)"""
    job = JobConfig(model=ModelConfig(num_layers=16, hidden_size=32, num_heads=4, ffn_size=64, vocab_size=64,
                                      vocab_multiple=64), train=TRAIN)
    layer_bytes = sum(s.nbytes for s in state_specs(job) if s.layer == 0)
    out = pool.run(transfer_case, [dict(rank=r, job=job, old=old.to_dict(), new=new.to_dict(), old_procs=[0, 1],
                                        new_procs=[0, 1], budget=1 << 20, release=True) for r in range(2)])
    for o in out:
        assert o["bad"] == []
        both = o["old_bytes"] + o["new_bytes"]
        bound = max(o["old_bytes"], o["new_bytes"]) + 3 * layer_bytes
        assert o["stats"]["peak_state_bytes"] <= bound < both


@pytest.mark.timeout(300)
@pytest.mark.parametrize("old,new,old_procs,new_procs", [(P(), P(tp=2), [0], [0, 1]), (P(tp=2), P(pp=2), [0, 1], [0, 1])],
                         ids=["tp1->tp2", "tp2->pp2"])
def test_larger_slices_bit_exact(pool, old, new, old_procs, new_procs):
    """Larger slices (>= 1 MiB) in packs and in place: bit exact."""
    job = JobConfig(model=ModelConfig(num_layers=2, hidden_size=512, num_heads=4, ffn_size=1024, vocab_size=256,
                                      vocab_multiple=64), train=TRAIN)
    out = pool.run(transfer_case, [dict(rank=r, job=job, old=old.to_dict(), new=new.to_dict(), old_procs=old_procs,
                                        new_procs=new_procs, budget=64 << 20) for r in range(2)])
    for o in out:
        assert o["bad"] == [] and o["extra"] == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 3)), min_size=1, max_size=60), st.integers(100, 400))
def test_staging_ring_hands_out_disjoint_regions_within_its_size(ops, size):
    """Regions taken from the ring and not yet given back never overlap, and stay inside it."""
    from liver.transfer.staging import StagingRing
    ring = StagingRing(size, torch.device("cpu"))
    live: list[tuple[int, int]] = []
    base = ring.buffer.data_ptr()
    for nbytes, frees in ops:
        buf = ring.take(nbytes)
        while buf is None:
            assert live, "an empty ring refused a request that fits"
            ring.give_back()
            live.pop(0)
            buf = ring.take(nbytes)
        lo = buf.data_ptr() - base
        assert 0 <= lo and lo + nbytes <= size and lo % 16 == 0
        assert all(lo + nbytes <= a or b <= lo for a, b in live)
        live.append((lo, lo + nbytes))
        assert ring.in_use == sum(b - a for a, b in live) <= size
        for _ in range(min(frees, len(live))):
            ring.give_back()
            live.pop(0)


def _chunk_table(specs, size, dim_of):
    """FSDP2-style: each tensor split by torch.chunk along ``dim_of(spec)`` over ``size`` ranks
    (uneven; trailing ranks may hold nothing)."""
    from liver.resource_view.table import BoxTable
    boxes = {}
    for s in specs:
        d = dim_of(s)
        n = s.shape[d]
        step = -(-n // size)
        rows = []
        for r in range(size):
            box = [(0, x) for x in s.shape]
            box[d] = (min(r * step, n), min((r + 1) * step, n))
            rows.append([tuple(box)])
        boxes[s.name] = rows
    return BoxTable.build(size, boxes, specs)


def table_case(*, store_addr, namespace, rank, old_procs, new_procs, budget):
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    specs = state_specs(JOB)
    old = _chunk_table(specs, len(old_procs), lambda s: 0)
    new = _chunk_table(specs, len(new_procs), lambda s: len(s.shape) - 1)
    plan = plan_transfer(old, new, specs, old_procs, new_procs)
    group = _transfer_group(store_addr, namespace, old_procs, new_procs, rank)
    src = _reference_state(specs, old.box, old_procs, rank)
    dst, stats = StreamingExecutor(plan, specs, rank, group, budget, cpu).run(src)
    bad = []
    if rank in plan.placement:
        r = plan.placement.index(rank)
        bad = [s.name for s in specs if (b := new.box(s, r)) is not None
               and (s.name not in dst or not torch.equal(dst[s.name], reference_shard(s, b, cpu)))]
    return {"bad": bad, "stats": stats.to_dict(), "moved": plan.bytes_moved}


@pytest.mark.timeout(300)
def test_box_tables_stream_bit_exact_across_processes(pool):
    """Uneven torch.chunk shards along rows over 3 processes -> along columns over 2 others (one
    leaves, one joins), through the same executor as the Layout's plans."""
    out = pool.run(table_case, [dict(rank=r, old_procs=[0, 1, 2], new_procs=[2, 3], budget=1 << 16)
                                for r in range(4)])
    assert all(o["bad"] == [] for o in out), out
    assert sum(o["stats"]["bytes_received"] for o in out) == out[0]["moved"] > 0
