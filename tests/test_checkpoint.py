"""DCP checkpoint path: save in one layout, load in another (load-time resharding), exactly."""

import pytest

from segments import run_segment
from liver.topology import ParallelConfig as P

PAIRS = [
    (P(tp=2), P(dp=2)),                                              # TP -> DP
    (P(pp=2, layers_per_stage=(3, 1)), P(pp=2, layers_per_stage=(1, 3))),  # uneven PP moves layers
    (P(tp=2, pp=2), P()),                                            # 4 ranks -> 1
    (P(dp=2), P(tp=2, pp=2, dp=2)),                                  # 2 -> 8, all three axes
    (P(tp=2, pp=2, dp=2), P(tp=1, pp=3, dp=1)),                      # 8 -> 3, uneven default split
    (P(tp=4, pp=1, dp=1), P(tp=2, pp=1, dp=2)),                      # TP 4 -> 2 with DP
]


def _segment(pool, job, pc, **kw):
    return pool.run(run_segment, [dict(rank=r, job=job.to_dict(), parallel=pc.to_dict(), **kw)
                                  for r in range(pc.world_size)])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a.short()}->{b.short()}" for a, b in PAIRS])
def test_reshard_through_checkpoint_is_exact(pool, tiny_job, tmp_path, src, dst):
    saved = _segment(pool, tiny_job, src, steps=3, save_to=str(tmp_path / "ck"))
    first = _segment(pool, tiny_job, dst, steps=2, load_from=str(tmp_path / "ck"))
    assert first[0]["digest_start"] == saved[0]["digest_end"]  # (and training on from it is deterministic:
    assert first[0]["step"] == 5                                # tests/test_engine.py, tests/test_switch.py)


def test_old_checkpoints_are_pruned_only_once_a_newer_one_is_published_whole(tmp_path):
    """Keep the newest K published: a write in flight (no metadata yet, newer than the latest) and
    the checkpoints latest.json points at are never removed; an unfinished older one goes too."""
    import json as _json

    from liver.checkpoint.periodic import LATEST, prune

    def make(step, whole=True):
        d = tmp_path / f"step{step:08d}"
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
        if whole:
            (d / ".metadata").write_bytes(b"m")
        return d

    dirs = {s: make(s) for s in (2, 4, 6, 8, 10)}
    torn = make(5, whole=False)       # a write that failed (a full disk)
    flight = make(12, whole=False)    # being written now
    (tmp_path / LATEST).write_text(_json.dumps({"step": 10, "path": str(dirs[10]),
                                                "previous": {"step": 8, "path": str(dirs[8])}}))
    gone = prune(tmp_path, keep=3)
    assert sorted(p.name for p in gone) == ["step00000002", "step00000004", "step00000005"]
    assert all(dirs[s].exists() for s in (6, 8, 10)) and flight.exists() and not torn.exists()
    # keep=1 still keeps the one latest.json names as the fallback before it
    prune(tmp_path, keep=1)
    assert dirs[10].exists() and dirs[8].exists() and not dirs[6].exists() and flight.exists()
    assert prune(tmp_path / "nothing-here", keep=2) == []
