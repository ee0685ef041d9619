"""Megatron-Core behind LiveR: a GPT model of Megatron-Core built on a generation's own groups
(``model.py``: no ``initialize_model_parallel``), its configuration as the job file gives it
(``config.py``), its Resource View read from Megatron's own sharded-state metadata (``view.py``;
the distributed optimizer's flat ranges, by Megatron's own arithmetic, cut into boxes:
``distopt.py``, ``ranges.py``), one rank's engine (``engine.py``: any device; ``gpu_engine.py``:
Megatron's DDP, distributed optimizer and schedule, on a GPU) and the adapters a job file selects
(``engine = "liver.engine.megatron:ADAPTER"`` or ``"...:GPU_ADAPTER"``, ``adapter.py``); what its
code asks of CUDA answered on a CPU build of torch (``cpu.py``).
Megatron-Core is an optional dependency (``pip install liver[megatron]``): importing this package
does not import it; ``model.megatron()`` does, or says how to install it."""

from liver.engine.megatron.adapter import ADAPTER, GPU_ADAPTER, MegatronAdapter, MegatronGpuAdapter

__all__ = ["ADAPTER", "GPU_ADAPTER", "MegatronAdapter", "MegatronGpuAdapter"]
