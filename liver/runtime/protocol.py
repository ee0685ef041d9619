"""What the controller and the worker processes say to each other, through the job's TCPStore.

Everything lives under the prefix ``run/`` of the store the controller owns:

- ``gen/{g}``          the generation spec: layout, the process of each new rank, the old generation
- ``plan/{g}``         the transfer plan into generation g (a pickled ``Plan``), made once by the
                       controller: every process reads it instead of working it out again beside
                       training (the 1b plan: 0.7 ms of CPU to unpickle, 3.6 ms to make;
                       bench/results/issue4-plan-pickle)
- ``ctl``              the controller's current wish: {"wanted": g, "stop_at": step, "force": g,
                       "end_at": step}
- ``progress``         the latest finished step (rank 0 of the Active World)
- ``ready/{g}/{proc}`` a process has built and warmed its part of generation g (time)
- ``switch/{g}/{proc}`` a process's record of the switch into generation g
- ``saved/{g}``        restart mode: the checkpoint the old generation wrote before stopping

Only rank 0 of the Active World reads ``ctl``, once per iteration boundary; the decision reaches
the other ranks through one small all-reduce (the consistent cut), so every rank takes the same
decision at the same boundary.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

PREFIX = "run/"


def run_store(store: dist.Store) -> dist.Store:
    return dist.PrefixStore(PREFIX, store)


def put(store: dist.Store, key: str, value: Any) -> None:
    store.set(key, json.dumps(value))


def get(store: dist.Store, key: str, default: Any = None) -> Any:
    """Non-blocking read: ``default`` when the key does not exist."""
    if not store.check([key]):
        return default
    return json.loads(store.get(key))


@dataclass
class GenerationSpec:
    generation: int
    parallel: dict[str, Any]
    procs: list[int]                      # procs[r]: the process that holds new rank r
    old_generation: int | None = None
    old_parallel: dict[str, Any] | None = None
    old_procs: list[int] | None = None
    load_from: str | None = None          # a checkpoint (first generation, restart, recovery)
    kind: str = "start"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def fetch(cls, store: dist.Store, g: int) -> "GenerationSpec":
        return cls(**json.loads(store.get(f"gen/{g}")))

    def publish(self, store: dist.Store) -> None:
        put(store, f"gen/{self.generation}", self.to_dict())


def publish_plan(store: dist.Store, g: int, plan: Any) -> None:
    """The job's own store is written only by its controller and workers (the control endpoint
    never writes it), so what is unpickled here comes from the controller."""
    store.set(f"plan/{g}", pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))


def fetch_plan(store: dist.Store, g: int) -> Any:
    return pickle.loads(store.get(f"plan/{g}"))


@dataclass
class Cut:
    """The decision every rank takes at an iteration boundary."""
    wanted: int     # the generation the controller wants prepared (0: none)
    ready_min: int  # lowest generation all ranks report ready (0: some rank is not ready)
    ready_max: int
    stop_at: int    # restart mode: save and stop after this step (0: never)
    force: int      # deadline: finish preparing generation ``force`` in the foreground
    end_at: int     # the job ends after this step (0: at its configured step count)
    ckpt_busy: int  # some rank is still writing the previous periodic checkpoint
    built_min: int = 0  # lowest generation whose groups every rank has built (not yet warmed)
    built_max: int = 0

    @property
    def warm_now(self) -> int:
        """The generation every rank has built: warm its groups now, all together (0: none)."""
        return self.built_min if self.built_min == self.built_max == self.wanted else 0

    @property
    def switch_to(self) -> int:
        """The generation to switch to now (0: none): every rank is ready for the same one."""
        return self.ready_min if self.ready_min == self.ready_max and self.ready_min == self.wanted else 0


def agree(group, store: dist.Store | None, ready_gen: int, ckpt_busy: bool = False,
          built_gen: int = 0) -> Cut:
    """Collective over the Active World: rank 0 contributes the controller's wish, everybody its
    readiness and whether its checkpoint writer is busy. ``store`` is given on rank 0 only."""
    # "ctl" exists before any worker starts: one round trip, no existence check
    wish = json.loads(store.get("ctl")) if store is not None else {}
    v = torch.tensor([wish.get("wanted", 0), -ready_gen, ready_gen, wish.get("stop_at", 0),
                      wish.get("force", 0), wish.get("end_at", 0), int(ckpt_busy), -built_gen, built_gen],
                     dtype=torch.int64, device=group.device)
    group.allreduce(v, "max")
    w, neg_min, mx, stop_at, force, end_at, busy, neg_bmin, bmax = (int(x) for x in v.tolist())
    return Cut(wanted=w, ready_min=-neg_min, ready_max=mx, stop_at=stop_at, force=force, end_at=end_at,
               ckpt_busy=busy, built_min=-neg_bmin, built_max=bmax)
