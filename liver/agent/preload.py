"""What the zygote (``liver.agent.zygote``) does once, before it forks any worker: import torch and
the worker's modules, warm the companion's code paths (and, for CPU workers, a training step) by
rehearsals, and move all of it out of the cyclic garbage collector's view, so that no worker's
collection walks (and copies) these pages.

The template must stay single-threaded and must not touch the GPU driver: a CUDA context does not
survive a fork. A backward pass starts the autograd engine's device threads (and with them the
CUDA driver, on a CUDA build), so the training-step rehearsal is for CPU workers only."""

import os


def warm_template(cpu_step: bool) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from liver.runtime.member import warm_process

    torch.set_num_threads(1)
    warm_process(cpu_step)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise RuntimeError(f"the zygote has {threads} threads after its warm-up; a fork would copy only "
                           f"one of them (cpu_step={cpu_step})")
