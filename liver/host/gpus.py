"""This machine's GPUs, as the job's processes will see them, counted without torch (a node agent
imports no torch, and makes no CUDA context: its workers do)."""

from __future__ import annotations

import os
import shutil
import subprocess

CPU_SLOTS = 4  # a CPU node's default slots (gloo): workers that share its cores


def visible(env: dict[str, str] | None = None, proc: str = "/proc/driver/nvidia/gpus") -> int:
    """NVIDIA GPUs the processes will see: ``CUDA_VISIBLE_DEVICES`` where set (its entries up to
    the first empty one, as CUDA reads it), else the driver's (``/proc/driver/nvidia/gpus``, else
    ``nvidia-smi -L``), else 0."""
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        entries = env["CUDA_VISIBLE_DEVICES"].split(",")
        n = 0
        for e in entries:
            if not e.strip():
                break
            n += 1
        return n
    try:
        return len(os.listdir(proc))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def slots(backend: str) -> int:
    """A node's slots where none are set: its GPUs on NCCL (``visible``), else ``CPU_SLOTS``."""
    return visible() if backend == "nccl" else CPU_SLOTS
