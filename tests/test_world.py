"""World: a second generation is built in the background while the first keeps training.

Two processes train on generation 0; a third process is started; generation 1 over all three is
built in a background thread while generation 0 keeps stepping; then both generations'
collectives give the right sums.
"""

import multiprocessing as mp
import threading
from datetime import timedelta

import pytest
import torch

from liver.engine.reference.trainer import Engine
from liver.topology import JobConfig, Layout, ModelConfig, ParallelConfig, TrainConfig
from liver.world.world import World, connect_store, make_store

JOB = JobConfig(model=ModelConfig(num_layers=2, hidden_size=32, num_heads=4, ffn_size=64, seq_len=16),
                train=TrainConfig(global_batch=6, micro_batch=1, corpus_bytes=1 << 20))


def _member(rank: int, addr: str, results) -> None:
    torch.set_num_threads(1)
    store = connect_store(addr)
    out = {"rank": rank}
    gen1_layout = Layout(JOB.model.num_layers, ParallelConfig(dp=3), JOB.train)
    if rank < 2:
        gen0 = World.build(store, 0, Layout(JOB.model.num_layers, ParallelConfig(dp=2), JOB.train), rank)
        gen0.connect()
        engine = Engine(JOB, gen0, torch.device("cpu"))
        engine.train_step()
        store.set(f"trained/{rank}", "1")
        shadow: dict = {}

        def build():
            w = World.build(store, 1, gen1_layout, rank)
            w.connect()
            shadow["world"] = w

        t = threading.Thread(target=build)
        t.start()
        steps_during_build = overlapped = 0
        while True:
            engine.train_step()
            steps_during_build += 1
            overlapped += t.is_alive()  # this step ended while generation 1 was still being built
            # ranks agree at the iteration boundary that the shadow is ready (as the switch does);
            # deciding alone would let one rank stop stepping while the other still steps
            ready = torch.tensor([0.0 if t.is_alive() else 1.0])
            gen0.all.allreduce(ready, "min")
            if ready.item() == 1.0 and steps_during_build >= 2:
                break
        t.join()
        out["steps_during_build"] = steps_during_build
        out["overlapped"] = overlapped
        x = torch.tensor([float(rank + 1)])
        gen0.all.allreduce(x)
        out["gen0_sum"] = x.item()
        gen1 = shadow["world"]
    else:
        store.wait(["trained/0", "trained/1"])  # start only once generation 0 is training
        gen1 = World.build(store, 1, gen1_layout, rank)
        gen1.connect()
    y = torch.tensor([float(10 * (rank + 1))])
    gen1.all.allreduce(y)
    out["gen1_sum"] = y.item()
    out["gen1_generation"] = gen1.generation
    results.put(out)


@pytest.mark.timeout(120)
def test_shadow_generation_builds_while_old_one_trains():
    ctx = mp.get_context("spawn")
    store, addr = make_store(timeout_s=60)
    results = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(r, addr, results)) for r in range(2)]
    for p in procs:
        p.start()
    store.wait(["trained/0", "trained/1"], timedelta(seconds=90))
    late = ctx.Process(target=_member, args=(2, addr, results))  # the third process starts now
    late.start()
    procs.append(late)
    outs = sorted((results.get(timeout=90) for _ in range(3)), key=lambda o: o["rank"])
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert [o["gen1_sum"] for o in outs] == [60.0, 60.0, 60.0]
    assert [o["gen0_sum"] for o in outs[:2]] == [3.0, 3.0]
    assert all(o["overlapped"] >= 1 for o in outs[:2])  # generation 0 trained while 1 was built


def _mesh_case(*, store_addr, namespace, rank, placement):
    """Generation 1 renumbers the processes (process p holds rank placement.index(p)); its mesh's
    coordinates are the generation's, its axes are the World's groups, and a DTensor works on it."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, Shard

    torch.set_num_threads(1)
    store = dist.PrefixStore(namespace + "/", connect_store(store_addr))
    layout = Layout(JOB.model.num_layers, ParallelConfig(tp=2, dp=2), TrainConfig(global_batch=4, micro_batch=1))
    r = placement.index(rank)
    w = World.build(store, 1, layout, r, procs=placement)
    mesh = w.mesh()
    c = layout.coord(r)
    out = {"coordinate": tuple(mesh.get_coordinate()), "expected": (c.pp, c.dp, c.tp),
           "tp_is_world_tp": mesh.get_group("tp") is w.tp.pg, "dp_is_world_dp": mesh.get_group("dp") is w.dp.pg}
    local = torch.tensor([float(r)])
    full = DTensor.from_local(local, mesh, [Replicate(), Replicate(), Shard(0)], run_check=False).full_tensor()
    out["full"] = full.tolist()
    out["tp_peers"] = [float(m) for m in layout.tp_group(r)]
    w.destroy()
    return out


def test_world_mesh_has_the_generations_coordinates_and_groups(pool):
    placement = [2, 0, 3, 1]  # new rank -> process
    out = pool.run(_mesh_case, [dict(rank=p, placement=placement) for p in range(4)])
    for o in out:
        assert o["coordinate"] == o["expected"]
        assert o["tp_is_world_tp"] and o["dp_is_world_dp"]
        assert o["full"] == o["tp_peers"]  # gathered over the World's own tp group


def test_a_preparation_whose_member_never_arrives_is_let_go_at_once_when_abandoned():
    """The groups' own rendezvous before Gloo's (``group.arrive``): members that all arrive go on
    at once; one that never comes (a joiner stopped by a controller that withdrew its generation)
    holds the others only until their preparation is abandoned (``pause`` raises), not for the
    groups' timeout; without an abandon, a TimeoutError names the missing member."""
    import threading
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from liver.world.group import arrive

    store = dist.HashStore()
    other = threading.Thread(target=arrive, args=(store, "g1", [0, 1], 1, lambda: None, timedelta(seconds=30)))
    other.start()
    t0 = time.monotonic()
    arrive(store, "g1", [0, 1], 0, lambda: None, timedelta(seconds=30))
    other.join()
    assert time.monotonic() - t0 < 5

    abandoned_at = time.monotonic() + 0.5

    def pause():
        if time.monotonic() > abandoned_at:
            raise InterruptedError("abandoned")

    t0 = time.monotonic()
    with pytest.raises(InterruptedError):
        arrive(store, "g2", [0, 1, 2], 0, pause, timedelta(seconds=120))
    assert time.monotonic() - t0 < 3
    with pytest.raises(TimeoutError, match=r"g3: processes \[2\] did not arrive within 0.6 s"):
        store.set("g3/arrived/1", "1")
        arrive(store, "g3", [0, 1, 2], 0, lambda: None, timedelta(seconds=0.6))


def test_waiting_for_members_over_a_tcp_store_writes_nothing_to_the_log(capfd):
    """A joiner may take seconds to boot: the ranks waiting for it look at the store quietly (torch
    logs each timed-out wait: four lines a second in every rank's log, before)."""
    import threading
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from liver.world.group import arrive

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    late = threading.Timer(1.2, lambda: client.set("g/arrived/1", "1"))
    late.start()
    t0 = time.monotonic()
    arrive(server, "g", [0, 1], 0, lambda: None, timedelta(seconds=30))
    assert 1.1 < time.monotonic() - t0 < 3
    late.join()
    assert "waitForInput" not in capfd.readouterr().err

