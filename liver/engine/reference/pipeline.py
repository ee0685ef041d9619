"""Pipeline parallelism: the 1F1B schedule (one forward, one backward) over micro-batches.

Stage s runs min(pp - s - 1, m) warm-up forwards, then alternates one forward and one backward,
then drains the remaining backwards: at most pp - s activations are alive at once. Neighbouring
stages exchange activations and gradients over the World's PP group with group-local ranks.
"""

from __future__ import annotations

from typing import Callable

import torch

from liver.world.group import Group

FWD_TAG, BWD_TAG = 1, 2

# forward(micro_index, input activation or None) -> output activation, or the scaled loss on the
# last stage; the input is returned so that its gradient can be sent back.
ForwardFn = Callable[[int, torch.Tensor | None], torch.Tensor]


class OneFOneB:
    """One pipeline stage's view of the schedule for one training step."""

    def __init__(self, pp: Group, act_shape: tuple[int, ...], act_dtype: torch.dtype,
                 device: torch.device) -> None:
        self.pp = pp
        self.first = pp.rank == 0
        self.last = pp.rank == pp.size - 1
        self.act_shape = act_shape
        self.act_dtype = act_dtype
        self.device = device

    def _empty(self) -> torch.Tensor:
        return torch.empty(self.act_shape, dtype=self.act_dtype, device=self.device)

    # ---- communication, Megatron-style combined operations ----------------------------------
    def _recv_forward(self) -> torch.Tensor | None:
        if self.first:
            return None
        x = self._empty()
        self.pp.exchange([], [(x, self.pp.rank - 1)], FWD_TAG)
        return x

    def _send_forward(self, y: torch.Tensor) -> None:
        if not self.last:
            self.pp.exchange([(y.detach().contiguous(), self.pp.rank + 1)], [], FWD_TAG)

    def _recv_backward(self) -> torch.Tensor | None:
        if self.last:
            return None
        g = self._empty()
        self.pp.exchange([], [(g, self.pp.rank + 1)], BWD_TAG)
        return g

    def _send_backward(self, g: torch.Tensor | None) -> None:
        if not self.first:
            self.pp.exchange([(g.contiguous(), self.pp.rank - 1)], [], BWD_TAG)

    def _send_forward_recv_backward(self, y: torch.Tensor) -> torch.Tensor | None:
        if self.last:
            return None
        g = self._empty()
        self._pair(self.pp.rank + 1, y.detach().contiguous(), FWD_TAG, g, BWD_TAG)
        return g

    def _send_backward_recv_forward(self, g: torch.Tensor | None) -> torch.Tensor | None:
        if self.first:
            return None
        x = self._empty()
        self._pair(self.pp.rank - 1, g.contiguous(), BWD_TAG, x, FWD_TAG)
        return x

    def _pair(self, peer: int, out: torch.Tensor, out_tag: int, into: torch.Tensor,
              in_tag: int) -> None:
        if self.pp.backend == "nccl":  # tags are ignored by NCCL; one coalesced call
            self.pp.exchange([(out, peer)], [(into, peer)])
            return
        send = self.pp.isend(out, peer, out_tag)
        self.pp.recv(into, peer, in_tag)
        send.wait()

    # ---- the schedule ------------------------------------------------------------------------
    def _forward(self, fn: ForwardFn, i: int, x: torch.Tensor | None):
        if x is not None:
            x.requires_grad_(True)
        return x, fn(i, x)

    def _backward(self, x: torch.Tensor | None, y: torch.Tensor,
                  grad: torch.Tensor | None) -> torch.Tensor | None:
        torch.autograd.backward(y, grad_tensors=grad)
        return None if x is None else x.grad

    def run(self, fn: ForwardFn, num_micro: int) -> list[float]:
        """Run one step; returns the last stage's per-micro-batch (scaled) losses, else []."""
        warmup = min(self.pp.size - self.pp.rank - 1, num_micro)
        inflight: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        losses: list[float] = []

        def keep(x, y):
            if self.last:
                losses.append(float(y.detach()))
            inflight.append((x, y))

        for i in range(warmup):
            x, y = self._forward(fn, i, self._recv_forward())
            self._send_forward(y)
            keep(x, y)
        remaining = num_micro - warmup
        x_next = self._recv_forward() if remaining > 0 else None
        for j in range(remaining):
            x, y = self._forward(fn, warmup + j, x_next)
            keep(x, y)
            grad_y = self._send_forward_recv_backward(y)
            x_b, y_b = inflight.pop(0)
            gx = self._backward(x_b, y_b, grad_y)
            if j == remaining - 1:
                self._send_backward(gx)
            else:
                x_next = self._send_backward_recv_forward(gx)
        for _ in range(warmup):
            x_b, y_b = inflight.pop(0)
            gx = self._backward(x_b, y_b, self._recv_backward())
            self._send_backward(gx)
        assert not inflight
        return losses
