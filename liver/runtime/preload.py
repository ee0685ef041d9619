"""What a worker template (the agent's zygote) runs once before it forks any worker: import torch
and the worker's modules, warm the companion's code paths (and, for CPU workers, a training step)
by rehearsals, and move all of it out of the cyclic garbage collector's view, so that no worker's
collection walks (and copies) these pages. The agent knows these only as import strings.

The template must stay single-threaded and must not touch the GPU driver: a CUDA context does not
survive a fork. A backward pass starts the autograd engine's device threads (and with them the
CUDA driver, on a CUDA build), so the training-step rehearsal is for CPU workers only."""

import os

ENTRY = "liver.runtime.member:main"        # a worker process's entry point
FRESH_MODULE = "liver.runtime.member"      # the same, run as ``python -m`` by a fresh interpreter
CPU_PRELOAD = "liver.runtime.preload:cpu_worker"
GPU_PRELOAD = "liver.runtime.preload:gpu_worker"


def _warm(engine: str, cpu_step: bool) -> None:
    import torch

    from liver.engine.interface import load_adapter
    from liver.runtime.member import warm_process

    torch.set_num_threads(1)
    warm_process(load_adapter(engine), cpu_step)


def cpu_worker(engine: str) -> None:
    """``engine``: the job's engine, by import path (its code paths are rehearsed). On a CUDA build
    of torch a backward pass starts device threads even for CPU tensors, so the training step is
    rehearsed only on a CPU build."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch's import: no thread pool
    import torch
    _warm(engine, cpu_step=torch.version.cuda is None and getattr(torch.version, "hip", None) is None)


def gpu_worker(engine: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _warm(engine, cpu_step=False)


def for_backend(backend: str) -> str:
    return CPU_PRELOAD if backend == "gloo" else GPU_PRELOAD
