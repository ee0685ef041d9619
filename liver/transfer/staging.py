"""Staging memory of a transfer: one buffer of at most B bytes, allocated once (before the
switch), handed out as a ring in first-in first-out order.

The executor completes its messages oldest first, so the regions in use always form one
contiguous run of the ring (possibly wrapped). Reuse is safe in stream order: a region is handed
out again only after the operations that used it were waited for (on a GPU, the current stream
waits for them; the next copy into, or message from, the region is queued behind that wait).
"""

from __future__ import annotations

from collections import deque

import torch


class StagingRing:
    def __init__(self, nbytes: int, device: torch.device) -> None:
        if nbytes < 0:
            raise ValueError(f"staging nbytes={nbytes}: must be >= 0")
        self.size = nbytes
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self._regions: deque[tuple[int, int]] = deque()  # (start, end), oldest first
        self.in_use = 0

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A region of ``nbytes`` (16-byte aligned start), or None until older regions are given back."""
        if nbytes > self.size:
            raise ValueError(f"staging request of {nbytes} bytes exceeds the ring's {self.size} bytes")
        start = self._place(nbytes)
        if start is None:
            return None
        self._regions.append((start, start + nbytes))
        self.in_use += nbytes
        return self.buffer[start:start + nbytes]

    def _place(self, n: int) -> int | None:
        if not self._regions:
            return 0
        first, last_end = self._regions[0][0], _align(self._regions[-1][1])
        if self._regions[-1][0] >= first:  # not wrapped: free is [last_end, size) and [0, first)
            if last_end + n <= self.size:
                return last_end
            return 0 if n <= first else None
        return last_end if last_end + n <= first else None  # wrapped: free is [last_end, first)

    def give_back(self, count: int = 1) -> None:
        """The ``count`` oldest regions are free again."""
        for _ in range(count):
            start, end = self._regions.popleft()
            self.in_use -= end - start


def _align(n: int) -> int:
    return (n + 15) // 16 * 16
