"""What the zygote (``liver.agent.zygote``) does once, before it forks any worker: import torch and
the worker's modules, warm the companion's code paths (and, for CPU workers, a training step) by
rehearsals, and move all of it out of the cyclic garbage collector's view, so that no worker's
collection walks (and copies) these pages.

The template must stay single-threaded and must not touch the GPU driver: a CUDA context does not
survive a fork. A backward pass starts the autograd engine's device threads (and with them the
CUDA driver, on a CUDA build), so the training-step rehearsal is for CPU workers only."""

import gc
import os


def warm_template(cpu_step: bool) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    import liver.runtime.member  # noqa: F401
    from liver.runtime.companion import rehearse
    from liver.runtime.mock import rehearse_step

    torch.set_num_threads(1)
    rehearse()
    if cpu_step:
        rehearse_step()
    gc.collect()
    gc.freeze()
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise RuntimeError(f"the zygote has {threads} threads after its warm-up; a fork would copy only "
                           f"one of them (cpu_step={cpu_step})")
