"""Box tables (resource_view/table.py) and the planner over them (planner/views.py): random
uneven and empty torch.chunk-style splits with replicas, planned and executed in-process on
numpy arrays: every destination element exactly once and right, nothing the destination already
holds sent over the network; on a Layout's table the same bytes as the analytic planner."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from liver.engine.reference.trainer import state_specs
from liver.planner import plan_transfer
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable, LayoutView
from liver.resource_view.view import box_numel
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig

SPECS = [TensorSpec("a", (7, 5), "float32", 0, 0), TensorSpec("a.m", (7, 5), "float32", 0, 0, kind="m", param="a"),
         TensorSpec("b", (1, 9), "float32", 1, None), TensorSpec("c", (13,), "float32", 2, 0)]


def chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """torch.chunk's split of n rows into at most ``parts`` pieces; missing pieces are empty at n."""
    size = -(-n // parts)
    out = [(min(i * size, n), min((i + 1) * size, n)) for i in range(parts)]
    return out


@st.composite
def tables(draw, specs=SPECS):
    """A mesh of replicas x shards; each tensor split along a dimension of its own by torch.chunk."""
    replicas, shards = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    size = replicas * shards
    boxes = {}
    for s in specs:
        dim = draw(st.integers(0, len(s.shape) - 1))
        row = []
        for r in range(size):
            lo, hi = chunks(s.shape[dim], shards)[r % shards]
            box = [(0, n) for n in s.shape]
            box[dim] = (lo, hi)
            row.append([tuple(box)])
        boxes[s.name] = row
    # a parameter and its moments keep one geometry (as an optimizer's state does)
    boxes["a.m"] = boxes["a"]
    return BoxTable.build(size, boxes, specs)


def reference(s: TensorSpec, specs: list[TensorSpec] = SPECS) -> np.ndarray:
    return np.arange(s.numel, dtype=np.int64).reshape(s.shape) * len(specs) + specs.index(s)


def execute(plan, specs, old: BoxTable, new: BoxTable):
    """Run the plan on arrays: returns each new rank's shards and how often each element was written."""
    by_name = {s.name: s for s in specs}
    held = {(r, s.name): reference(s, specs)[tuple(slice(lo, hi) for lo, hi in b)]
            for s in specs for r in range(old.size) if (b := old.box(s, r)) is not None}
    out = {(n, s.name): np.full([hi - lo for lo, hi in b], -1, dtype=np.int64)
           for s in specs for n in range(new.size) if (b := new.box(s, n)) is not None}
    writes = {k: np.zeros(v.shape, dtype=np.int64) for k, v in out.items()}
    old_rank_of = {p: r for r, p in enumerate(plan.old_procs)}
    for t in plan.tasks:
        for name in t.tensors:
            src = held[(t.src, name)][tuple(slice(lo, hi) for lo, hi in t.src_box)]
            dst = tuple(slice(lo, hi) for lo, hi in t.dst_box)
            out[(t.dst, name)][dst] = src
            writes[(t.dst, name)][dst] += 1
            if t.kind == "send":  # nothing the destination process already held crosses the network
                mine = old_rank_of.get(t.dst_proc)
                b_new = new.box(by_name[name], t.dst)
                b_old = old.box(by_name[name], mine) if mine is not None else None
                if b_old is not None:
                    g = [(lo + o, hi + o) for (lo, hi), (o, _) in zip(t.dst_box, b_new)]
                    assert not all(blo <= lo and hi <= bhi for (lo, hi), (blo, bhi) in zip(g, b_old)), t
            if t.kind == "keep":
                assert t.src_proc == t.dst_proc and t.same
    return out, writes


@settings(max_examples=300, deadline=None)
@given(old=tables(), new=tables(), data=st.data())
def test_any_tables_are_planned_exactly_once_and_right(old, new, data):
    old_procs = list(range(old.size))
    new_procs = data.draw(st.permutations(list(range(max(old.size, new.size) + 1))))[:new.size]
    assert_exact(plan_transfer(old, new, SPECS, old_procs, new_procs), SPECS, old, new)


def assert_exact(plan, specs, old, new) -> None:
    """Run on arrays, ``plan`` writes every element of every new rank's box exactly once, with the
    logical tensor's value there; it counts its bytes consistently, and its placement moves no
    more than the identity one."""
    out, writes = execute(plan, specs, old, new)
    for (n, name), arr in out.items():
        s = next(x for x in specs if x.name == name)
        b = new.box(s, n)
        assert (writes[(n, name)] == 1).all(), (n, name)
        assert (arr == reference(s, specs)[tuple(slice(lo, hi) for lo, hi in b)]).all(), (n, name)
    assert len(out) == sum(new.box(s, n) is not None for s in specs for n in range(new.size))
    moved = sum(t.nbytes for t in plan.tasks if t.kind == "send")
    assert moved == plan.bytes_moved == sum(plan.rank_bytes_in.values()) == sum(plan.rank_bytes_out.values())
    assert plan.bytes_moved <= plan.bytes_moved_identity  # the placement never moves more


JOB = JobConfig(model=ModelConfig(num_layers=3, hidden_size=16, num_heads=4, ffn_size=24, vocab_size=40,
                                  vocab_multiple=8), train=TrainConfig(global_batch=12, micro_batch=1))


@settings(max_examples=40, deadline=None)
@given(a=st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 3, 1), (2, 1, 2), (1, 1, 3), (4, 1, 1)]),
       b=st.sampled_from([(1, 1, 2), (2, 3, 1), (1, 1, 1), (4, 1, 3), (2, 1, 1)]))
def test_a_layouts_table_moves_what_the_analytic_planner_moves(a, b):
    specs = state_specs(JOB)
    old, new = (Layout(JOB.model.num_layers, ParallelConfig(tp=x[0], pp=x[1], dp=x[2]), JOB.train) for x in (a, b))
    old_procs, new_procs = list(range(old.size)), list(range(new.size))
    analytic = plan_transfer(old, new, specs, old_procs, new_procs, optimize_placement=False)
    tables = plan_transfer(BoxTable.of_view(LayoutView(old), specs), BoxTable.of_view(LayoutView(new), specs), specs,
                           old_procs, new_procs, optimize_placement=False)
    assert tables.bytes_moved == analytic.bytes_moved
    assert tables.bytes_moved_identity == analytic.bytes_moved_identity
    per = lambda p: sorted((t.src_proc, t.dst_proc, box_numel(t.dst_box) * len(t.tensors)) for t in p.tasks  # noqa: E731
                           if t.kind == "send")
    assert sum(x[2] for x in per(tables)) == sum(x[2] for x in per(analytic))


def test_bad_tables_are_refused_naming_the_tensor_and_rank():
    s = [TensorSpec("w", (4, 2), "float32", 0, 0)]
    with pytest.raises(ValueError, match="rank 1 holds 2 boxes of 'w'"):
        BoxTable.build(2, {"w": [[((0, 2), (0, 2))], [((2, 3), (0, 2)), ((3, 4), (0, 2))]]}, s)
    with pytest.raises(ValueError, match="rank 0's box .* of 'w' is outside its shape"):
        BoxTable.build(1, {"w": [[((0, 5), (0, 2))]]}, s)
    with pytest.raises(ValueError, match="do not cover it"):
        BoxTable.build(2, {"w": [[((0, 1), (0, 2))], [((2, 4), (0, 2))]]}, s)
    with pytest.raises(ValueError, match="boxes for 1 ranks; 2 required"):
        BoxTable.build(2, {"w": [[((0, 4), (0, 2))]]}, s)
    overlap = BoxTable.build(2, {"w": [[((0, 3), (0, 2))], [((1, 4), (0, 2))]]}, s)  # partial overlap
    whole = BoxTable.build(1, {"w": [[((0, 4), (0, 2))]]}, s)
    with pytest.raises(ValueError, match="must tile it exactly once"):
        plan_transfer(overlap, whole, s, [0, 1], [5])


def test_empty_chunks_hold_nothing():
    """FSDP2 over 4 ranks of a 1-row tensor: ranks 1-3 hold empty shards; they send and receive nothing."""
    s = [TensorSpec("bias", (1, 3), "float32", 0, 0)]
    four = BoxTable.build(4, {"bias": [[((lo, hi), (0, 3))] for lo, hi in chunks(1, 4)]}, s)
    two = BoxTable.build(2, {"bias": [[((lo, hi), (0, 3))] for lo, hi in chunks(1, 2)]}, s)
    assert [four.box(s[0], r) for r in range(4)] == [((0, 1), (0, 3)), None, None, None]
    plan = plan_transfer(four, two, s, [0, 1, 2, 3], [2, 3])
    assert {t.src_proc for t in plan.tasks} == {0} and {t.dst for t in plan.tasks} == {0}
