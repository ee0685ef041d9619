"""What a worker template (the agent's zygote) runs once before it forks any worker: import torch
and the worker's modules, rehearse the companion's code paths (and, for CPU workers, a training step)
by rehearsals, and move all of it out of the cyclic garbage collector's view, so that no worker's
collection walks (and copies) these pages. The agent knows these only as import strings.

The template must stay single-threaded and must not touch the GPU driver: a CUDA context does not
survive a fork. A backward pass starts the autograd engine's device threads (and with them the
CUDA driver, on a CUDA build), so the training-step rehearsal is for CPU workers only."""

import contextlib
import os

ENTRY = "liver.runtime.member:main"        # a worker process's entry point
FRESH_MODULE = "liver.runtime.member"      # the same, run as ``python -m`` by a fresh interpreter
CPU_PRELOAD = "liver.runtime.preload:cpu_worker"
GPU_PRELOAD = "liver.runtime.preload:gpu_worker"


def _rehearse(engine: str, cpu_step: bool) -> None:
    import torch

    from liver.engine.interface import load_adapter
    from liver.runtime.member import rehearse_process

    torch.set_num_threads(1)
    rehearse_process(load_adapter(engine), cpu_step)


def _single_threaded() -> None:
    """Before torch's import: no thread pool in the template, whatever the user's OMP_NUM_THREADS
    (its math libraries start one at load from it; a fork would copy only the calling thread).
    The workers set their own thread count after the fork (``liver.host.threads.worker_threads``), as torchrun does."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"


@contextlib.contextmanager
def _no_driver():
    """DTensor's sharding runs its fake tensors at each meta build, and they ask for the CUDA
    driver (``torch.cuda.is_available()``, and without a device
    ``torch._C._ensureCUDADeviceGuardSet()``): either answer (the driver's, or NVML's) leaves a
    thread of the driver's in the template. Meanwhile there is no device to the template, and the
    guard is left as it is; its workers see the real ones."""
    import torch
    saved = [(torch.cuda, "is_available", lambda: False), (torch._C, "_ensureCUDADeviceGuardSet", lambda: None)]
    real = [getattr(owner, name) for owner, name, _ in saved]
    for owner, name, stand_in in saved:
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        for (owner, name, _), r in zip(saved, real):
            setattr(owner, name, r)


def cpu_worker(engine: str) -> None:
    """``engine``: the job's engine, by import path (its code paths are rehearsed). On a CUDA build
    of torch (a CPU job on a GPU machine) a backward pass starts device threads even for CPU
    tensors, so the training step is rehearsed only on a CPU build, and the driver is kept out of
    the rehearsal as for GPU workers (``_no_driver``)."""
    _single_threaded()
    import torch
    cpu_build = torch.version.cuda is None and getattr(torch.version, "hip", None) is None
    with _no_driver():
        _rehearse(engine, cpu_step=cpu_build)


def gpu_worker(engine: str) -> None:
    """As ``cpu_worker``, no step rehearsed."""
    _single_threaded()
    with _no_driver():
        _rehearse(engine, cpu_step=False)


def for_backend(backend: str) -> str:
    return CPU_PRELOAD if backend == "gloo" else GPU_PRELOAD
