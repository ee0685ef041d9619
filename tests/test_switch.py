"""A live handoff between generations is bit-exact: the state digest right after the switch equals
the one right before it, and the following steps equal, bit for bit, those after the same change
made through a DCP checkpoint."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from liver.checkpoint import dcp as ckpt
from segments import run_segment
from liver.engine.digest import state_digest
from liver.engine.reference import ADAPTER
from liver.engine.reference.trainer import Engine, state_specs
from liver.planner import plan_transfer
from liver.runtime.switch import switch
from liver.transfer import StreamingExecutor
from liver.config.fields import from_dict, with_model
from liver.topology import JobConfig, Layout, ParallelConfig, ModelConfig
from liver.world.group import Group
from liver.world.world import World, connect_store


def handoff(*, store_addr, namespace, rank, job, old, new, old_procs, new_procs, steps_before, steps_after, save_to):
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    jc = with_model(from_dict(JobConfig, job, "job"), ModelConfig)
    old_l = Layout(jc.model.num_layers, ParallelConfig.from_dict(old), jc.train)
    new_l = Layout(jc.model.num_layers, ParallelConfig.from_dict(new), jc.train)
    store = dist.PrefixStore(namespace + "/", connect_store(store_addr))
    out = {}
    engine = None
    if rank in old_procs:
        w0 = World.build(store, 0, old_l, old_procs.index(rank))
        engine = Engine(jc, w0, cpu)
        for _ in range(steps_before):
            engine.train_step()
        out["digest_before"] = state_digest(engine)
        ckpt.save(engine, save_to)  # the same point, for the restart comparison
    plan = plan_transfer(old_l, new_l, state_specs(jc), old_procs, new_procs)
    members = sorted(set(old_procs) | set(new_procs))
    transfer = Group.create(store, "gen1/transfer", members, rank, "gloo", cpu, timedelta(seconds=60))
    w1 = World.build(store, 1, new_l, plan.placement.index(rank)) if rank in plan.placement else None
    executor = StreamingExecutor(plan, state_specs(jc), rank, transfer, 1 << 16, cpu)
    new_engine, info = switch(adapter=ADAPTER, job=jc, old=engine, new_world=w1, executor=executor, device=cpu)
    if engine is not None:
        engine.world.destroy()
    if new_engine is not None:
        w1.activate()
        out["digest_after"] = state_digest(new_engine)
        out["losses"] = [new_engine.train_step().loss for _ in range(steps_after)]
        out["digest_end"] = state_digest(new_engine)
        out["new_rank"] = w1.rank
        w1.destroy()
    return out


P = ParallelConfig
CASES = [
    ("scale-out tp2pp1dp1->tp2pp2dp2", P(tp=2), P(tp=2, pp=2, dp=2), [0, 1], list(range(8))),
    ("scale-in tp2pp2dp2->tp1pp3[1,1,2]", P(tp=2, pp=2, dp=2), P(pp=3, layers_per_stage=(1, 1, 2)), list(range(8)), [6, 1, 4]),
    ("in place tp2pp2->tp1pp1dp4", P(tp=2, pp=2), P(dp=4), [0, 1, 2, 3], [0, 1, 2, 3]),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,old,new,old_procs,new_procs", CASES, ids=[c[0] for c in CASES])
def test_live_handoff_equals_checkpoint_path(pool, tiny_job, tmp_path, name, old, new, old_procs, new_procs):
    n = len(set(old_procs) | set(new_procs))
    out = pool.run(handoff, [dict(rank=r, job=tiny_job.to_dict(), old=old.to_dict(), new=new.to_dict(),
                                  old_procs=old_procs, new_procs=new_procs, steps_before=2, steps_after=3,
                                  save_to=str(tmp_path / "ck")) for r in range(n)])
    before = {o["digest_before"] for o in out if "digest_before" in o}
    after = {o["digest_after"] for o in out if "digest_after" in o}
    assert len(before) == 1 and after == before
    live = next(o for o in out if o.get("new_rank") == 0)
    restart = pool.run(run_segment, [dict(rank=r, job=tiny_job.to_dict(), parallel=new.to_dict(), steps=3,
                                          load_from=str(tmp_path / "ck")) for r in range(new.world_size)])
    assert restart[0]["digest_start"] == live["digest_after"]
    assert restart[0]["losses"] == live["losses"]
    assert restart[0]["digest_end"] == live["digest_end"]
