"""``RunConfig``: a whole job's configuration, the components' own configs composed, checked as a whole.

Each component owns its options (``TransferConfig`` in transfer/, ``PrepareConfig`` in runtime/,
``CheckpointConfig`` in checkpoint/, ``ControllerConfig`` in controller/, ``AgentConfig`` in
agent/, ``EventsConfig`` beside the event parsers); ``RunConfig`` adds what belongs to the job
itself and checks what only the whole can (the first layout against the model, the GPUs against
the slots). A named job is a TOML file (``liver.config.jobfile``); every option is checked here,
before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from liver.agent.config import AgentConfig
from liver.checkpoint.config import CheckpointConfig
from liver.config.fields import with_model
from liver.controller.config import ControllerConfig
from liver.policy.events import EventsConfig
from liver.runtime.config import PrepareConfig
from liver.engine.interface import DEFAULT_ENGINE, EngineAdapter, absolute_engine_path, load_adapter
from liver.topology import JobConfig, ParallelConfig
from liver.topology.presets import PRESETS
from liver.transfer.config import TransferConfig

BACKENDS = ("gloo", "nccl")
DIGESTS = ("step", "switch")
MAX_STEPS = 10**9


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """- ``engine``: the training engine, by import path (``liver.engine.interface``).
    - ``preset``: the named job whose model and training options ``job`` starts from.
    - ``steps``: train at most this many steps; ``gpus``: processes at the start.
    - ``parallel``: the first configuration (unset: the controller chooses for ``gpus``).
    - ``digest``: state digests after every "step", or right before and after each "switch".
    - ``log_rank``: the rank (of each generation) whose step line is printed; -1: every rank's.
    - ``timeline``: draw ``timeline.png`` beside the report at the end (matplotlib: about a second
      of CPU)."""

    engine: str = DEFAULT_ENGINE
    preset: str = "tiny"
    job: JobConfig = field(default_factory=JobConfig)
    steps: int = 5000
    gpus: int = 2
    parallel: ParallelConfig | None = None
    backend: str = "gloo"
    digest: str | None = None
    log_rank: int = 0
    timeline: bool = True
    events: EventsConfig = field(default_factory=EventsConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", absolute_engine_path(self.engine))  # workers run elsewhere
        object.__setattr__(self, "job", with_model(self.job, load_adapter(self.engine).model_config))
        if self.preset not in PRESETS:
            raise ValueError(f"preset={self.preset!r}: allowed {', '.join(map(repr, PRESETS))}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: allowed {', '.join(map(repr, BACKENDS))}")
        if self.digest is not None and self.digest not in DIGESTS:
            raise ValueError(f"digest={self.digest!r}: allowed {', '.join(map(repr, DIGESTS))} or unset")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise ValueError(f"steps={self.steps!r}: allowed 1 to {MAX_STEPS}")
        if isinstance(self.log_rank, bool) or not isinstance(self.log_rank, int) or self.log_rank < -1:
            raise ValueError(f"log_rank={self.log_rank!r}: allowed a rank (0 or more), or -1 for every rank")
        slots = self.agent.slots
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1 or \
                (slots is not None and self.gpus > slots):
            raise ValueError(f"gpus={self.gpus!r}: allowed 1 to agent.slots={slots if slots is not None else '(unset)'}")
        if self.parallel is not None:
            # (with a trace, its first count is the job's GPUs: the trace is read, and ``gpus`` set, before it runs)
            if self.parallel.world_size != self.gpus and self.events.trace is None:
                raise ValueError(f"parallel={self.parallel.short()}: tp*pp*dp={self.parallel.world_size} "
                                 f"but gpus={self.gpus}")
            self.adapter.layout(self.job, self.parallel)

    @property
    def slots(self) -> int:
        """The node's worker slots (set by ``with_slots`` before a job runs)."""
        if self.agent.slots is None:
            raise RuntimeError("RunConfig.slots read before with_slots()")
        return self.agent.slots

    def with_slots(self, detected: int) -> "RunConfig":
        """``agent.slots`` filled in where unset (the GPU count on NCCL, 4 on CPU: ``detected``)."""
        if self.agent.slots is not None:
            return self
        return replace(self, agent=replace(self.agent, slots=detected))

    @property
    def adapter(self) -> EngineAdapter:
        return load_adapter(self.engine)

    @property
    def connect(self) -> str:
        return self.prepare.connect_for(self.backend)


__all__ = ["RunConfig"]
