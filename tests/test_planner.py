"""Planner properties over random (old, new) layouts of small models: every destination element is
written exactly once, from the same logical element; nothing the destination process already holds
crosses the network; replicas share the sending; placement never moves more than the identity."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liver.engine.reference.trainer import state_specs
from liver.planner import identity_placement, plan_transfer
from liver.resource_view import intersect, view
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig

MODELS = [ModelConfig(num_layers=4, hidden_size=16, num_heads=4, ffn_size=24, vocab_size=50, vocab_multiple=8),
          ModelConfig(num_layers=5, hidden_size=32, num_heads=8, ffn_size=64, vocab_size=256, vocab_multiple=16),
          ModelConfig(num_layers=3, hidden_size=24, num_heads=4, ffn_size=40, vocab_size=30, vocab_multiple=4)]
TRAIN = TrainConfig(global_batch=24, micro_batch=1)


@st.composite
def parallel(draw, model):
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if model.num_heads % t == 0 and model.ffn_size % t == 0
                               and model.padded_vocab_size % t == 0]))
    pp = draw(st.integers(1, model.num_layers))
    split = None
    if pp > 1 and draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, model.num_layers - 1), min_size=pp - 1, max_size=pp - 1)))
        edges = [0] + cuts + [model.num_layers]
        split = tuple(b - a for a, b in zip(edges, edges[1:]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    return ParallelConfig(tp=tp, pp=pp, dp=dp, layers_per_stage=split)


@st.composite
def cases(draw):
    model = draw(st.sampled_from(MODELS))
    old = Layout(model.num_layers, draw(parallel(model)), TRAIN)
    new = Layout(model.num_layers, draw(parallel(model)), TRAIN)
    old_procs = list(range(old.size))
    draw(st.randoms()).shuffle(old_procs)
    keep = draw(st.integers(0, min(old.size, new.size)))
    persisting = sorted(draw(st.permutations(old_procs))[:keep])
    joiners = list(range(old.size, old.size + new.size - keep))
    return model, old, new, old_procs, persisting + joiners, draw(st.booleans())


def _origin(box):
    return tuple(lo for lo, _ in box)


def _check_plan(model, old, new, old_procs, new_procs, plan):
    specs = {s.name: s for s in state_specs(JobConfig(model=model, train=TRAIN))}
    assert sorted(plan.placement) == sorted(new_procs)
    painted = {}
    for t in plan.tasks:
        for name in t.tensors:
            spec = specs[name]
            sbox, dbox = view(spec, old, t.src), view(spec, new, t.dst)
            assert sbox is not None and dbox is not None
            g_src = tuple((lo + o, hi + o) for (lo, hi), o in zip(t.src_box, _origin(sbox)))
            g_dst = tuple((lo + o, hi + o) for (lo, hi), o in zip(t.dst_box, _origin(dbox)))
            assert g_src == g_dst  # the same logical elements
            assert intersect(g_src, sbox) == g_src
            key = (name, t.dst)
            if key not in painted:
                painted[key] = np.zeros([hi - lo for lo, hi in dbox], dtype=np.int32)
            painted[key][tuple(slice(lo, hi) for lo, hi in t.dst_box)] += 1
            if t.src_proc != t.dst_proc and t.dst_proc in old_procs:
                held = view(spec, old, old_procs.index(t.dst_proc))
                assert held is None or intersect(held, g_dst) is None, "sent what the process holds"
    for name, spec in specs.items():  # complete: every destination shard painted exactly once
        for r in range(new.size):
            box = view(spec, new, r)
            if box is not None:
                assert (name, r) in painted, (name, r)
                assert (painted[(name, r)] == 1).all(), (name, r)
    assert len(painted) == sum(view(s, new, r) is not None for s in specs.values() for r in range(new.size))


@settings(max_examples=150, deadline=None)
@given(cases())
def test_plans_are_complete_unique_and_local_first(case):
    model, old, new, old_procs, new_procs, optimize = case
    specs = state_specs(JobConfig(model=model, train=TRAIN))
    plan = plan_transfer(old, new, specs, old_procs, new_procs, optimize_placement=optimize)
    _check_plan(model, old, new, old_procs, new_procs, plan)
    assert plan.bytes_moved == sum(t.nbytes for t in plan.tasks if t.src_proc != t.dst_proc)
    if optimize:
        assert plan.bytes_moved <= plan.bytes_moved_identity
    else:
        assert plan.placement == identity_placement(old_procs, new_procs)
        assert plan.bytes_moved == plan.bytes_moved_identity


def test_replicas_share_the_sending():
    model = MODELS[1]
    old = Layout(model.num_layers, ParallelConfig(tp=2, pp=1, dp=4), TRAIN)
    new = Layout(model.num_layers, ParallelConfig(tp=2, pp=1, dp=8), TRAIN)
    specs = state_specs(JobConfig(model=model, train=TRAIN))
    plan = plan_transfer(old, new, specs, list(range(8)), list(range(16)))
    out = plan.rank_bytes_out
    assert sorted(out) == list(range(8))  # every old replica sends
    assert max(out.values()) - min(out.values()) <= max(t.nbytes for t in plan.tasks)
    # four new replicas, nothing more (each TP rank holds its own copy of replicated tensors)
    assert plan.bytes_moved == 4 * sum(s.nbytes * (2 if s.shard_dim is None else 1) for s in specs)


def test_placement_keeps_shards_where_they_are():
    """TP2 DP2 -> TP2 DP2 with processes listed in another order: the optimal placement moves nothing."""
    model = MODELS[0]
    lay = Layout(model.num_layers, ParallelConfig(tp=2, dp=2), TRAIN)
    specs = state_specs(JobConfig(model=model, train=TRAIN))
    plan = plan_transfer(lay, lay, specs, [3, 1, 0, 2], [0, 1, 2, 3])
    assert plan.bytes_moved == 0 and plan.bytes_moved_identity == 0
    assert {t.kind for t in plan.tasks} == {"keep"}
    reshape = plan_transfer(lay, Layout(model.num_layers, ParallelConfig(tp=1, dp=4), TRAIN), specs, [0, 1, 2, 3], [0, 1, 2, 3])
    assert reshape.bytes_moved <= reshape.bytes_moved_identity
    assert reshape.bytes_moved == sum(t.nbytes for t in reshape.tasks if t.kind == "send") > 0


@pytest.mark.parametrize("kwargs, words", [
    (dict(new_procs=[0, 1, 2]), ["new_procs", "needs 4"]),
    (dict(placement=[0, 1, 2, 9]), ["placement", "[9]", "not in the new world"]),
    (dict(placement=[0, 1, 1, 2]), ["placement", "at most one"]),
    (dict(old_procs=[0, 1]), ["old_procs", "4 ranks"]),
])
def test_impossible_plans_are_refused(kwargs, words):
    model = MODELS[0]
    lay = Layout(model.num_layers, ParallelConfig(tp=2, dp=2), TRAIN)
    specs = state_specs(JobConfig(model=model, train=TRAIN))
    args = dict(old_procs=[0, 1, 2, 3], new_procs=[0, 1, 2, 3])
    args.update(kwargs)
    with pytest.raises(ValueError) as e:
        plan_transfer(lay, lay, specs, args["old_procs"], args["new_procs"], placement=args.get("placement"))
    for w in words:
        assert w in str(e.value)


def test_other_model_is_refused():
    lay = Layout(MODELS[0].num_layers, ParallelConfig(), TRAIN)
    other = Layout(MODELS[2].num_layers, ParallelConfig(), TRAIN)
    with pytest.raises(ValueError, match="model"):
        plan_transfer(lay, other, state_specs(JobConfig(model=MODELS[0], train=TRAIN)), [0], [0])
