"""The messages of the control protocol, typed; converted to and from JSON at the store only
(``write``/``read``), with ``liver.config.fields`` checking every field's type on the way in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

import torch.distributed as dist

from liver.config.fields import from_dict, to_dict
from liver.topology import ParallelConfig

GENERATION_KINDS = ("start", "restart", "recover", "resume", "heal", "scale-out", "scale-in", "reshape")

M = TypeVar("M")  # a message class


def write(store: dist.Store, key: str, message: object) -> None:
    store.set(key, json.dumps(to_dict(message)))


def read(store: dist.Store, key: str, cls: type[M]) -> M:
    """Blocking read of ``key`` as a ``cls`` (waits for the key up to the store's timeout)."""
    return from_dict(cls, json.loads(store.get(key)), key)


def read_if(store: dist.Store, key: str, cls: type[M]) -> M | None:
    return read(store, key, cls) if store.check([key]) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationSpec:
    """One generation: its configuration, and which process holds each of its ranks. A handoff's
    spec also names the generation it comes from; a spec started from a checkpoint names it."""

    generation: int
    parallel: ParallelConfig
    procs: tuple[int, ...]                  # procs[r]: the process that holds rank r
    kind: str = "start"
    old_generation: int | None = None
    old_parallel: ParallelConfig | None = None
    old_procs: tuple[int, ...] | None = None
    old_ranks: tuple[int, ...] | None = None  # a heal: the old ranks that survive, as old_procs hold them
    load_from: str | None = None
    nodes: tuple[str, ...] = ()             # nodes[r]: the node of rank r's process (LOCAL_WORLD_SIZE)

    def __post_init__(self) -> None:
        if self.nodes and len(self.nodes) != len(self.procs):
            raise ValueError(f"generation {self.generation}: nodes={self.nodes} needs one per process")
        if self.old_ranks is not None and (self.old_procs is None or len(self.old_ranks) != len(self.old_procs)):
            raise ValueError(f"generation {self.generation}: old_ranks={self.old_ranks} needs one process each")
        if self.kind not in GENERATION_KINDS:
            raise ValueError(f"generation.kind={self.kind!r}: allowed {', '.join(GENERATION_KINDS)}")
        if len(self.procs) != self.parallel.world_size:
            raise ValueError(f"generation {self.generation}: {len(self.procs)} processes for "
                             f"{self.parallel.short()} ({self.parallel.world_size} ranks)")

    @property
    def key(self) -> str:
        return self.key_of(self.generation)

    @staticmethod
    def key_of(g: int) -> str:
        return f"gen/{g}"

    @staticmethod
    def fetch(store: dist.Store, g: int) -> "GenerationSpec":
        return read(store, GenerationSpec.key_of(g), GenerationSpec)

    def publish(self, store: dist.Store) -> None:
        write(store, self.key, self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Wish:
    """The controller's wish (``publish``), the latest of which rank 0 brings to every boundary
    (its courier holds it: ``runtime.courier``): prepare ``wanted``
    (0: nothing), finish preparing ``force`` in the foreground (a deadline), restart mode's stop
    after step ``stop_at``, the job's end after step ``end_at`` (0: none of these)."""

    wanted: int = 0
    stop_at: int = 0
    force: int = 0
    end_at: int = 0

    KEY = "ctl"
    VERSION = "ctl/version"  # how many wishes were published (store.add's counter)

    @staticmethod
    def version_key(n: int) -> str:
        """Where the ``n``-th wish is kept: a reader waits for the next one's key to appear."""
        return f"ctl/{n}"

    def publish(self, store: dist.Store) -> int:
        """The controller's one writer: this wish as the latest (``KEY``) and as the next version,
        whose key wakes a reader blocked on it (``runtime.courier``). Returns its version."""
        payload = json.dumps(to_dict(self))
        store.set(self.KEY, payload)
        n = store.add(self.VERSION, 1)
        store.set(self.version_key(n), payload)
        return n


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """The latest finished step, from rank 0 of the Active World (``progress``)."""

    step: int
    generation: int
    loss: float
    step_s: float
    time: float
    parallel: str
    preparing: bool = False
    tokens_per_s: float = 0.0
    grad_norm: float | None = None
    mfu: float | None = None               # model FLOPs utilisation, where the device's peak is known
    memory_gib: float | None = None        # the device's peak reserved memory (GPU)
    digest: str | None = None
    digest_s: float = 0.0
    digest_error: str | None = None        # why the step's digest could not be taken (``DigestError``)
    checkpoint_step: int | None = None     # the newest checkpoint published whole (None: none stands)
    checkpoint_failures: int = 0           # periodic checkpoints failed in a row since the last good one
    checkpoint_error: str | None = None    # the latest failure's cause, while failures > 0
    ends: dict[str, float] | None = None   # {step: end time} of this generation's last steps (a
                                           # step trigger's exact time, seen late by the controller)

    KEY = "progress"


def beat_key(proc: int) -> str:
    """Where process ``proc`` writes the time every half second (``runtime.courier``): a
    process that stops writing (SIGSTOP, a hang that holds every thread) is stopped as failed."""
    return f"beat/{proc}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Fence:
    """Processes the controller declared lost with their node (its agent stopped syncing for
    ``controller.agent_timeout_s``): none of them trains again in any generation. Each worker
    watches for fences (``runtime.fence``): a fenced one stops at once, without another step
    record; its peers cut their connections to the generation, so their collectives fail now
    and they stall to be healed instead of waiting on it for the group's timeout."""

    procs: tuple[int, ...]
    node: str
    time: float

    VERSION = "fence/version"  # how many fences were published (store.add's counter)

    @staticmethod
    def version_key(n: int) -> str:
        return f"fence/{n}"

    def publish(self, store: dist.Store) -> int:
        """The controller's one writer: the next version, whose key wakes every watcher."""
        n = store.add(self.VERSION, 1)
        write(store, self.version_key(n), self)
        return n


@dataclass(frozen=True, kw_only=True, slots=True)
class Stalled:
    """A rank whose generation broke under it (a peer vanished mid-collective): it stopped at the
    last step it completed, holds its shards, and waits to be healed into ``heal/{generation}``
    (``stalled/{g}/{proc}``)."""

    proc: int
    generation: int
    step: int
    error: str
    hashes: tuple[Any, ...] | None = None  # its part of the state digest (``digest.local_hashes``), if asked
    scalars: dict[str, Any] | None = None

    @staticmethod
    def key(generation: int, proc: int) -> str:
        return f"stalled/{generation}/{proc}"

    @staticmethod
    def heal_key(generation: int) -> str:
        """Where the controller names the generation that heals ``generation``'s survivors."""
        return f"heal/{generation}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """A process could not prepare a generation (``error/{g}/{proc}``): the pending handoff is
    cancelled with this reason at once, not at the prepare timeout."""

    proc: int
    generation: int
    error: str

    @staticmethod
    def key(generation: int, proc: int) -> str:
        return f"error/{generation}/{proc}"


@dataclass(frozen=True, kw_only=True, slots=True)
class PrepareReport:
    """One process's preparation of a generation: what each phase took (seconds; CPU seconds where
    named ``_cpu_s``), and the communicators it created and took over from the Active World."""

    plan_s: float = 0.0
    build_s: float = 0.0
    schedule_s: float = 0.0
    build_cpu_s: float = 0.0
    paced_steps: int = 0             # boundaries it waited for: the steps it was spread over
    largest_unit_cpu_s: float = 0.0
    comms_created: int = 0
    comms_shared: int = 0
    connect_s: float = 0.0
    connect_cpu_s: float = 0.0
    groups_s: float = 0.0
    cores: int = 0                   # the cores it could run on
    mock_warmup_s: float = 0.0       # a cold joiner's steps on its mock world
    joiner_cpu_s: float = 0.0        # a cold joiner's CPU from its start to holding a rank
    prebuild_s: float = 0.0          # the new engine made before the pause (``EngineAdapter.prebuild``)
    prebuilt: str = ""               # what of it (``Prebuilt.path``); "" for a process leaving
    prebuilt_bytes: int = 0          # its storage, within the staging budget's spare
    ahead: str = ""                  # what of its first step's DTensor work was done then (``ahead.py``)
    ahead_s: float = 0.0             # its seconds, in the companion
    ahead_error: str = ""            # why it stopped short, if it did (the rest is done at the first step)
    precopy: str = ""                # whether its state is mirrored before the switch, and if not why
    precopy_s: float = 0.0           # making the mirror: its slices' schedules, its group and storage


@dataclass(frozen=True, kw_only=True, slots=True)
class SwitchReport:
    """A process's handoff into generation ``generation`` (``switch/{g}/{proc}``): an old rank's
    has ``old_step``, a new rank's ``new_rank``; memory figures on GPUs only."""

    proc: int
    generation: int
    prepare: PrepareReport
    transfer: dict[str, Any]         # the executor's figures (switch_s, seconds, bytes, messages, ...)
    switch_start: float
    switch_end: float
    preparing_since: float | None = None
    old_step: int | None = None
    new_rank: int | None = None
    step: int | None = None
    cores: tuple[int, ...] | None = None
    digest_before: str | None = None
    digest_before_s: float | None = None
    digest_after: str | None = None
    digest_after_s: float | None = None
    digest_error: str | None = None  # (``DigestError``: why a digest of this handoff could not be taken)
    mem_before_bytes: int | None = None
    mem_peak_bytes: int | None = None
    mem_after_bytes: int | None = None
    staging_reserved_bytes: int | None = None
    peak_extra_bytes: int | None = None
    process_start: float | None = None   # a cold joiner's start and end of imports
    imported: float | None = None
    precopy: dict[str, Any] | None = None  # an old rank's mirror (liver/runtime/mirror.py): what it copied, when, its cost

    @staticmethod
    def key(generation: int, proc: int) -> str:
        return f"switch/{generation}/{proc}"


@dataclass(frozen=True, kw_only=True, slots=True)
class StartReport:
    """A process of a generation started whole (first start, restart, recovery): ``start/{g}/{proc}``."""

    proc: int
    generation: int
    timings: dict[str, float]        # group_init_s, build_s, load_s
    process_start: float
    imported: float
    ready: float
    step: int
    cores: tuple[int, ...] | None = None
    digest_after: str | None = None
    digest_after_s: float | None = None
    digest_error: str | None = None

    @staticmethod
    def key(generation: int, proc: int) -> str:
        return f"start/{generation}/{proc}"


@dataclass(frozen=True, kw_only=True, slots=True)
class StopReport:
    """Restart mode: a process saved its part of the checkpoint and stopped (``stopped/{g}/{proc}``)."""

    proc: int
    generation: int
    step: int
    save_s: float
    saved_at: float
    digest_before: str | None = None
    digest_before_s: float | None = None
    digest_error: str | None = None

    @staticmethod
    def key(generation: int, proc: int) -> str:
        return f"stopped/{generation}/{proc}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Saved:
    """Restart mode: the checkpoint the old generation wrote (``saved/{g}``, rank 0's)."""

    path: str
    step: int

    @staticmethod
    def key(generation: int) -> str:
        return f"saved/{generation}"
