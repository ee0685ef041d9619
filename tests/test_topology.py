"""Topology: exhaustive properties of the rank layout, and refusal of every invalid input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liver.engine.reference import ADAPTER
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig, default_split


@st.composite
def layouts(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    heads = tp * draw(st.integers(1, 3))
    model = ModelConfig(num_layers=draw(st.integers(1, 9)), hidden_size=heads * 4, num_heads=heads,
                        ffn_size=tp * draw(st.integers(1, 5)) * 4, vocab_size=draw(st.integers(1, 300)),
                        vocab_multiple=16, seq_len=8)
    pp = draw(st.integers(1, model.num_layers))
    dp = draw(st.integers(1, 4))
    split = None
    if draw(st.booleans()) and pp > 1:
        cuts = sorted(draw(st.sets(st.integers(1, model.num_layers - 1), min_size=pp - 1, max_size=pp - 1)))
        edges = [0] + cuts + [model.num_layers]
        split = tuple(b - a for a, b in zip(edges, edges[1:]))
    mb = draw(st.integers(1, 2))
    train = TrainConfig(global_batch=dp * mb * draw(st.integers(1, 3)), micro_batch=mb)
    return Layout(model.num_layers, ParallelConfig(tp=tp, pp=pp, dp=dp, layers_per_stage=split), train, tp * pp * dp)


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_rank_coordinates_are_a_bijection(lay):
    seen = set()
    for r in range(lay.size):
        c = lay.coord(r)
        assert lay.rank(*c) == r
        seen.add(c)
    assert len(seen) == lay.size


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_groups_partition_the_ranks(lay):
    for axis, n in (("tp", lay.tp), ("dp", lay.dp), ("pp", lay.pp)):
        groups = lay.all_groups(axis)
        assert all(len(g) == n for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(lay.size))
        for g in groups:  # members differ only along their own axis
            coords = [lay.coord(r) for r in g]
            for other in {"tp", "dp", "pp"} - {axis}:
                assert len({getattr(c, other) for c in coords}) == 1


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_stages_cover_every_layer_once(lay):
    owners = [lay.stage_of_layer(i) for i in range(lay.layers)]
    assert owners == sorted(owners)
    assert set(owners) == set(range(lay.pp))
    assert lay.stage_of_layer(-1) == 0 and lay.stage_of_layer(lay.layers) == lay.pp - 1
    assert lay.num_micro_batches * lay.train.micro_batch * lay.dp == lay.train.global_batch


def test_default_split_is_even_with_remainder_first():
    assert default_split(7, 3) == (3, 2, 2)
    assert default_split(4, 4) == (1, 1, 1, 1)


M = ModelConfig(num_layers=4, hidden_size=32, num_heads=4, ffn_size=48, vocab_size=100, vocab_multiple=8)
T = TrainConfig(global_batch=8, micro_batch=2)


@pytest.mark.parametrize("build, words", [
    (lambda: ADAPTER.layout(JobConfig(model=M, train=T), ParallelConfig(tp=3)), ["tp=3", "num_heads=4"]),
    (lambda: ADAPTER.layout(JobConfig(model=ModelConfig(num_layers=2, hidden_size=32, num_heads=8, ffn_size=36,
                                                        vocab_size=64), train=T), ParallelConfig(tp=8)),
     ["tp=8", "ffn_size=36"]),
    (lambda: ADAPTER.layout(JobConfig(model=M, train=T), ParallelConfig(tp=8)), ["tp=8"]),
    (lambda: Layout(M.num_layers, ParallelConfig(pp=5), T), ["pp=5", "4 layers"]),
    (lambda: Layout(M.num_layers, ParallelConfig(pp=2, layers_per_stage=(1, 2)), T), ["layers_per_stage", "sums to 3"]),
    (lambda: Layout(M.num_layers, ParallelConfig(tp=2, pp=2, dp=1), T, world_size=8), ["world_size=8", "tp*pp*dp"]),
    (lambda: Layout(M.num_layers, ParallelConfig(dp=3), T), ["global_batch=8", "dp*micro_batch=3*2"]),
    (lambda: ParallelConfig(tp=0), ["parallel.tp=0"]),
    (lambda: ParallelConfig(pp=2, layers_per_stage=(4,)), ["layers_per_stage", "pp=2"]),
    (lambda: ParallelConfig(pp=2, layers_per_stage=(4, 0)), ["layers_per_stage", "at least one"]),
    (lambda: ParallelConfig.parse("2,2"), ["'2,2'", "tp,pp,dp"]),
    (lambda: ParallelConfig.parse("a,1,1"), ["'a,1,1'"]),
    (lambda: ModelConfig(hidden_size=30, num_heads=4), ["num_heads=4", "hidden_size=30"]),
    (lambda: ModelConfig(num_layers=0), ["num_layers=0"]),
    (lambda: TrainConfig(global_batch=0), ["global_batch=0"]),
    (lambda: TrainConfig(lr=-1.0), ["lr=-1.0"]),
    # (a NaN passes every comparison; an infinite rate or a zero epsilon trains to NaN)
    (lambda: TrainConfig(lr=float("nan")), ["train.lr=nan", "finite"]),
    (lambda: TrainConfig(lr=float("inf")), ["train.lr=inf", "finite"]),
    (lambda: TrainConfig(min_lr=float("nan")), ["train.min_lr=nan"]),
    (lambda: TrainConfig(eps=0.0), ["train.eps=0.0", "> 0"]),
    (lambda: TrainConfig(beta1=1.0), ["train.beta1=1.0", "below 1"]),
    (lambda: TrainConfig(grad_clip=-1.0), ["train.grad_clip=-1.0", "0: no clipping"]),
    (lambda: TrainConfig(weight_decay=float("inf")), ["train.weight_decay=inf"]),
    (lambda: TrainConfig(warmup_steps=-1), ["train.warmup_steps=-1"]),
    (lambda: JobConfig(compute_dtype="fp8"), ["compute_dtype='fp8'"]),
])
def test_invalid_configuration_is_refused_with_field_and_value(build, words):
    with pytest.raises(ValueError) as e:
        build()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_coord_outside_world_is_refused():
    lay = Layout(M.num_layers, ParallelConfig(tp=2), T)
    with pytest.raises(ValueError, match="rank=2"):
        lay.coord(2)


def test_a_configuration_reads_back_from_its_short_form_and_spells_as_an_event_names_it():
    from hypothesis import given, strategies as st

    from liver.topology import ParallelConfig

    @given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 64), st.booleans(), st.data())
    def check(tp, pp, dp, split, data):
        lps = tuple(data.draw(st.lists(st.integers(1, 9), min_size=pp, max_size=pp))) if split else None
        c = ParallelConfig(tp=tp, pp=pp, dp=dp, layers_per_stage=lps)
        assert ParallelConfig.from_short(c.short()) == c
        assert ParallelConfig.parse(c.spelt()) == c

    check()
    import pytest
    with pytest.raises(ValueError, match="expected tpXppYdpZ"):
        ParallelConfig.from_short("2,1,2")
