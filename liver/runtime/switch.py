"""The switch: hand the training state of one generation to the next over the network.

Given this process's engine on the old generation (None for a joiner), the new generation's
World, a transfer group over every process of both, and a plan, stream the shards, adopt them in
a new engine and carry the scalars over. This is the only pause of a live reconfiguration.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from liver.engine.interface import EngineAdapter, Prebuilt, TrainingEngine
from liver.topology import JobConfig
from liver.transfer.executor import StreamingExecutor
from liver.world.world import World


def switch(*, adapter: EngineAdapter, job: JobConfig, old: TrainingEngine | None, new_world: World | None,
           executor: StreamingExecutor, device: torch.device,
           into: dict[str, torch.Tensor] | None = None,
           prebuilt: Prebuilt | None = None,
           mirrored: dict[str, torch.Tensor] | None = None) -> tuple[TrainingEngine | None, dict[str, Any]]:
    """Returns the engine on the new generation (None if this process leaves) and timings.
    ``executor``: this process's side of the plan, made before the switch, on the transfer group
    over every process of both generations. ``into``: new-layout storage allocated before the
    switch (a joiner's warm-up state). ``prebuilt``: what Prepare made of the new engine. The
    timings name the build the switch ran (``build``) and the seconds it took beside the transfer
    (``build_s``). ``mirrored``: this process's new shards a pre-copy made current before the switch
    (liver/runtime/mirror.py): ``executor`` then moves only the rest."""
    t0 = time.perf_counter()
    plan, transfer, proc = executor.plan, executor.group, executor.proc
    scalars = transfer.broadcast_json(old.scalars() if old is not None and proc == plan.old_procs[0] else None,
                                      src=transfer.members.index(plan.old_procs[0]))
    if old is not None:  # the old engine ends here: its compute copies go first, its shards
        old.release_compute()  # layer by layer as they are sent (bounded extra memory, invariant I2)
    ran: list = []

    def deliver(storage: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        shards, stats = executor.run(old.state if old is not None else None, release=old is not None, into=storage)
        ran.append(stats)
        return {**shards, **(mirrored or {})}

    engine, built = None, {}
    if new_world is None:
        deliver(None)
    else:
        if old is not None:  # the old generation's groups are not the default any more
            old.world.deactivate()
        new_world.activate()  # (DeviceMesh asks the default group for the rank)
        # mirrored shards are the new engine's to adopt, as kept ones are
        kept = {**executor.kept_of(old.state if old is not None else None), **(mirrored or {})}
        t1 = time.perf_counter()
        engine = adapter.enter(job, new_world, device, deliver, into, kept=kept, prebuilt=prebuilt)
        engine.load_scalars(scalars)
        engine.refresh()
        built = {"build": prebuilt.path if prebuilt is not None else "built at the switch",
                 "build_s": time.perf_counter() - t1 - ran[0].seconds}
    return engine, {"switch_s": time.perf_counter() - t0, **built, **ran[0].to_dict()}
