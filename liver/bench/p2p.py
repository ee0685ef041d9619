"""Point-to-point bandwidth between two processes of a Group: the transfer floor's denominator."""

from __future__ import annotations

import statistics
import time

import torch


def p2p_bandwidth(group, peer: int, sending: bool, device: torch.device, nbytes: int = 1 << 30,
                  reps: int = 10) -> float:
    """GB/s of one ``nbytes`` send from this process to ``peer`` (or receive), median of ``reps``."""
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    op = group.send if sending else group.recv
    for _ in range(3):
        op(buf, peer)
    torch.cuda.synchronize(device)
    times = []
    for _ in range(reps):
        group.barrier()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        op(buf, peer)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9
