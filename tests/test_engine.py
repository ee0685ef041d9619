"""The reference engine on real processes over gloo: parallel correctness and determinism."""

import pytest
import torch

from segments import run_segment
from liver.topology import ParallelConfig

CONFIGS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)]
STEPS = 4


def _run(pool, job, pc, **kw):
    return pool.run(run_segment, [dict(rank=r, job=job.to_dict(), parallel=pc.to_dict(), steps=STEPS, **kw)
                                  for r in range(pc.world_size)])


@pytest.fixture(scope="module")
def reference(pool):
    from conftest import TINY
    return _run(pool, TINY, ParallelConfig())[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tp,pp,dp", CONFIGS)
def test_parallel_losses_match_single_process(pool, tiny_job, reference, tp, pp, dp):
    out = _run(pool, tiny_job, ParallelConfig(tp=tp, pp=pp, dp=dp), digests=False)
    ref = reference["losses"]
    for r in out:  # every rank reports the same global loss
        assert r["losses"] == out[0]["losses"]
    for a, b in zip(out[0]["losses"], ref):
        assert abs(a - b) <= 1e-5 * abs(b), (out[0]["losses"], ref)
    for a, b in zip(out[0]["grad_norms"], reference["grad_norms"]):
        assert abs(a - b) <= 1e-4 * abs(b)


@pytest.mark.timeout(300)
def test_uneven_pipeline_split_matches(pool, tiny_job, reference):
    out = _run(pool, tiny_job, ParallelConfig(tp=1, pp=2, dp=1, layers_per_stage=(3, 1)), digests=False)
    for a, b in zip(out[0]["losses"], reference["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (2, 2, 2)])
def test_same_run_twice_is_bitwise_identical(pool, tiny_job, tp, pp, dp):
    pc = ParallelConfig(tp=tp, pp=pp, dp=dp)
    a, b = _run(pool, tiny_job, pc), _run(pool, tiny_job, pc)
    assert a[0]["losses"] == b[0]["losses"]
    assert a[0]["digest_end"] == b[0]["digest_end"]
    assert len({r["digest_end"] for r in a}) == 1  # all ranks agree on the digest


@pytest.mark.timeout(300)
def test_initial_state_is_layout_independent(pool, tiny_job):
    """Each rank initialises only its shards, yet every layout starts from one logical state."""
    outs = [pool.run(run_segment, [dict(rank=r, job=tiny_job.to_dict(), parallel=pc.to_dict(), steps=0)
                                   for r in range(pc.world_size)])
            for pc in (ParallelConfig(), ParallelConfig(tp=2, pp=2), ParallelConfig(tp=2, dp=2, pp=2))]
    assert len({o[0]["digest_start"] for o in outs}) == 1


def test_box_hashes_see_every_bit_and_not_the_split():
    """A box hash changes when any one bit of the tensor changes; the hashes of the pieces of any
    cut of a tensor add up (modulo 2**64) to the hash of the whole."""
    from liver.engine.digest import _M, box_hash
    g = torch.Generator().manual_seed(3)
    t = torch.randn(6, 10, 3, generator=g)
    shape = tuple(t.shape)
    whole = box_hash(t, ((0, 6), (0, 10), (0, 3)), shape)
    for cut in ([((0, 6), (0, 4)), ((0, 6), (4, 10))], [((0, 1), (0, 10)), ((1, 6), (0, 7)), ((1, 6), (7, 10))]):
        parts = [box_hash(t[r0:r1, c0:c1], ((r0, r1), (c0, c1), (0, 3)), shape) for (r0, r1), (c0, c1) in cut]
        assert tuple(sum(p[k] for p in parts) % _M for k in range(2)) == whole
    bits = t.clone().view(torch.int32)
    for r, c, b in [(0, 0, 0), (5, 9, 31), (2, 3, 17)]:
        flipped = bits.clone()
        flipped[r, c, 1] ^= (1 << b) if b < 31 else -(1 << 31)
        changed = box_hash(flipped.view(torch.float32), ((0, 6), (0, 10), (0, 3)), shape)
        assert changed[0] != whole[0] and changed[1] != whole[1]
    swapped = t.clone()
    swapped[0, 0, 0], swapped[0, 0, 1] = t[0, 0, 1], t[0, 0, 0]
    assert box_hash(swapped, ((0, 6), (0, 10), (0, 3)), shape) != whole

def test_replicas_that_differ_are_an_error_of_the_digest_never_averaged_away():
    """Every replica ends with equal state (after any handoff or failure): two ranks holding the
    same box with different bits make the digest fail, naming the box."""
    from liver.engine.digest import combine
    from liver.resource_view.spec import TensorSpec

    spec = TensorSpec("w", (4,), "float32", layer=0, shard_dim=None)
    same = [[[0, [[0, 4]], [1, 2]]], [[0, [[0, 4]], [1, 2]]]]
    assert combine([spec], same, {}) == combine([spec], same[:1], {})  # replicas count once
    with pytest.raises(RuntimeError, match=r"tensor 'w', box \[\[0, 4\]\]: the replica of rank 1 differs"):
        combine([spec], [same[0], [[0, [[0, 4]], [1, 3]]]], {})


def test_mfu_is_the_models_flops_over_the_peak_of_the_dtype_its_matmuls_run_in():
    import torch

    from liver.engine.flops import mfu, peak_flops
    from liver.topology import ModelFacts
    assert peak_flops(torch.device("cpu"), "bfloat16") is None  # no figure where no peak is known
    per = ModelFacts.decoder(10**9, 16, 2048, 2048).flops_per_token
    assert mfu(per, 1000.0, None, 1) is None
    assert per == 6e9 + 12 * 16 * 2048 * 2048
    assert mfu(per, 10_000.0, 989e12, 2) == per * 10_000.0 / (989e12 * 2)
