"""Megatron-Core on a CPU build of torch (LiveR's tests and CPU jobs run it so, over gloo).

Megatron-Core is written for CUDA; what its GPT model and its checkpoint ask of CUDA are answered
here for the CPU, in a process that trains on the CPU (``install``, idempotent; undone for a
process that then trains on a GPU):

- ``torch.cuda.current_device()``, which Megatron passes as a ``device`` for scratch tensors
  (RoPE's frequencies, TP's gathers): the CPU, to Megatron's own calls only;
- ``torch.cuda.synchronize()``, which its checkpoint writer calls before it copies: nothing;
- its global scratch-memory buffer, which ``initialize_model_parallel`` makes (this engine does
  not call it: groups are the World's own): made (``memory_buffer``, which a GPU needs too);
- its model-parallel RNG tracker, which forks CUDA generator states for dropout in TP regions:
  a tracker of CPU generator states with the same interface and seeding
  (``model_parallel_cuda_manual_seed``'s: the TP rank's seed offset by 2718).

Also, with no attention mask given, Megatron makes a causal one on "cuda": the engine passes its
own (``causal_mask``).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch

TP_SEED_OFFSET = 2718
"""Megatron's offset of the tensor-parallel RNG's seed (``model_parallel_cuda_manual_seed``)."""


class CpuRngTracker:
    """Megatron's ``CudaRNGStatesTracker`` over CPU generator states: named states, each forked
    into for a block of operations (the global CPU generator holds it for the duration), and left
    with its advance kept."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._current_state_name = "default-rng"

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = {k: v.clone() for k, v in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"the RNG seed {seed} is already in use")
        if name in self.states_:
            raise ValueError(f"the RNG state {name!r} already exists")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise ValueError(f"the RNG state {name!r} is not added")
        outside = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outside)


def install(device: torch.device | str = "cpu") -> bool:
    """The shims above, in this process, where it trains on ``device`` "cpu" (a CPU job on a machine
    with GPUs too: the process is the CPU job's); for any other device, Megatron's own CUDA answers
    back where a CPU build before had shimmed them (a test process builds on both), and False."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random

    on_cpu = torch.device(device).type == "cpu"
    shimmed = isinstance(torch.cuda.current_device, _MegatronOnCpu)
    if on_cpu and not shimmed:
        torch.cuda.current_device = _MegatronOnCpu(torch.cuda.current_device)  # type: ignore[assignment]
        torch.cuda.synchronize, _REAL["synchronize"] = _nothing, torch.cuda.synchronize  # type: ignore[assignment]
    elif not on_cpu and shimmed:
        torch.cuda.current_device = torch.cuda.current_device.real  # type: ignore[assignment,union-attr]
        torch.cuda.synchronize = _REAL.pop("synchronize")  # type: ignore[assignment]
    if on_cpu != shimmed:  # (scratch tensors it cached on the other device, and the other RNG tracker)
        parallel_state._GLOBAL_MEMORY_BUFFER = None
        random._CUDA_RNG_STATE_TRACKER = CpuRngTracker() if on_cpu else None
        random._CUDA_RNG_STATE_TRACKER_INITIALIZED = on_cpu
    memory_buffer()
    if on_cpu and not isinstance(random._CUDA_RNG_STATE_TRACKER, CpuRngTracker):
        random._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
        random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return on_cpu


_REAL: dict[str, object] = {}  # (what ``install`` shimmed, to put back)


def memory_buffer() -> None:
    """Megatron's process-wide scratch buffer (attention's and TP's gathers), which
    ``initialize_model_parallel`` would make; on any device (idempotent)."""
    from megatron.core import parallel_state

    if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None) is None:
        parallel_state._set_global_memory_buffer()


class _MegatronOnCpu:
    """``torch.cuda.current_device`` in a CPU job: "cpu" to Megatron's code, which asks it where to
    make its scratch tensors; torch's own answer to everyone else (torch's DCP on a machine that
    has GPUs asks it for the current stream)."""

    def __init__(self, real) -> None:
        self.real = real

    def __call__(self):
        return "cpu" if sys._getframe(1).f_globals.get("__name__", "").startswith("megatron.") else self.real()


def seed(seed: int, tp_rank: int) -> None:
    """Megatron's ``model_parallel_cuda_manual_seed`` with the TP rank given (not read from its
    global state): the default generators at ``seed`` (the same on every rank of a data-parallel
    group), the tensor-parallel state at ``seed`` + 2718 + the TP rank; in Megatron's tracker, or
    in the CPU one ``install`` put in its place."""
    from megatron.core.tensor_parallel import random

    torch.manual_seed(seed)  # (the CUDA generators too, where there are some)
    tracker = random.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", seed + TP_SEED_OFFSET + tp_rank)


def causal_mask(seq: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The causal attention mask as Megatron takes it: True where a position may not attend."""
    return torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)[None, None]


def _nothing(*args, **kw) -> None:
    return None
