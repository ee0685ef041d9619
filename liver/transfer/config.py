"""The streaming transfer's options (one owner: the executor reads nothing else)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_BUDGET_MIB = 1 << 20  # 1 TiB: beyond any device's memory


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferConfig:
    """``budget_mib``: the staging budget B each process reserves for a handoff (MiB). The extra
    memory of a handoff is B plus the communicators', whatever the model's size."""

    budget_mib: int = 512

    def __post_init__(self) -> None:
        if isinstance(self.budget_mib, bool) or not isinstance(self.budget_mib, int) \
                or not 1 <= self.budget_mib <= MAX_BUDGET_MIB:
            raise ValueError(f"transfer.budget_mib={self.budget_mib!r}: allowed an integer from 1 to "
                             f"{MAX_BUDGET_MIB} (MiB of staging per process)")

    @property
    def budget_bytes(self) -> int:
        return self.budget_mib << 20
