"""What a worker process is started with: one JSON file, written by the node agent, read once.

``WorkerConfig`` is the job's share of the options a worker needs, the same for every worker
of the job; ``WorkerSpec`` adds who this process is. Both are converted to and from plain data
here only (``liver.config.fields``), so the two sides cannot disagree on a default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from liver.checkpoint.config import CheckpointConfig
from liver.config.fields import from_dict, to_dict, with_model
from liver.engine.interface import DEFAULT_ENGINE, EngineAdapter, load_adapter
from liver.runtime.config import PrepareConfig
from liver.topology import JobConfig
from liver.transfer.config import TransferConfig

ROLES = ("start", "joiner")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    job: JobConfig
    backend: str
    engine: str = DEFAULT_ENGINE
    steps: int
    digest: str | None = None
    log_rank: int = 0
    connect: str = "background"  # resolved for the backend ("auto" never reaches a worker)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    orphan_after_s: float = 0.0  # no answer from the job's store this long: it stops itself (0: never)

    @property
    def adapter(self) -> EngineAdapter:
        return load_adapter(self.engine)

    def __post_init__(self) -> None:
        object.__setattr__(self, "job", with_model(self.job, self.adapter.model_config))
        if self.connect not in ("background", "boundary"):
            raise ValueError(f"worker.connect={self.connect!r}: allowed 'background', 'boundary'")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    """``role``: "start" (a rank of a generation started from a seed or a checkpoint) or "joiner"
    (a cold process of a pending generation); ``cores``: the cores it is bound to, or None;
    ``agent``: the process of the agent that started it, which it watches: a worker whose agent
    is gone for ``orphan_after_s`` ends (no one could stop it, were its controller gone too)."""

    proc: int
    slot: int
    role: str
    generation: int
    store_addr: str
    run_dir: str
    config: WorkerConfig
    cores: tuple[int, ...] | None = None
    agent: str | None = None  # the agent that started it (``host.process.ProcessRef``): gone, it stops itself


    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"worker.role={self.role!r}: allowed {', '.join(map(repr, ROLES))}")

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(to_dict(self)))

    @staticmethod
    def read(path: str | Path) -> "WorkerSpec":
        return from_dict(WorkerSpec, json.loads(Path(path).read_text()), "worker")
