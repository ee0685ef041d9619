"""The consistent cut: every rank of the Active World takes the same decision at an iteration
boundary, from one small all-reduce. Only rank 0 brings the controller's wish (the latest its courier holds);
every rank adds its own readiness, so the result is the same everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from liver.protocol.messages import Wish


@dataclass(frozen=True, slots=True)
class Cut:
    """What every rank knows after the boundary's all-reduce."""
    wanted: int     # the generation the controller wants prepared (0: none)
    ready_min: int  # lowest generation all ranks report ready (0: some rank is not ready)
    ready_max: int
    stop_at: int    # restart mode: save and stop after this step (0: never)
    force: int      # deadline: finish preparing generation ``force`` in the foreground
    end_at: int     # the job ends after this step (0: at its configured step count)
    ckpt_busy: int  # some rank is still writing the previous periodic checkpoint
    built_min: int = 0  # lowest generation whose groups every rank has built (not yet connected)
    built_max: int = 0
    precopy_min: int = 0  # the slices of the ranks' pre-copies (0: a rank has none)
    precopy_max: int = 0

    @property
    def precopy_slices(self) -> int:
        """The slices every rank's pre-copy has (the same plan everywhere); 0 where some rank has none
        (its engine cannot replay, its copies did not fit): then nobody mirrors, everything streams."""
        return self.precopy_min if self.precopy_min == self.precopy_max else 0

    @property
    def connect_now(self) -> int:
        """The generation every rank has built: connect its groups now, all together (0: none)."""
        return self.built_min if self.built_min == self.built_max == self.wanted else 0

    @property
    def switch_to(self) -> int:
        """The generation every rank is ready for and the controller still wants (0: none)."""
        return self.ready_min if self.ready_min == self.ready_max and self.ready_min == self.wanted else 0


def agree(group, wish: Wish | None, ready_gen: int, ckpt_busy: bool = False, built_gen: int = 0,
          precopy_slices: int = 0) -> Cut:
    """Collective over the Active World: rank 0 contributes the controller's ``wish`` (None on the
    other ranks), everybody its readiness, whether its checkpoint writer is busy, and the slices of
    its ready preparation's pre-copy."""
    w = wish or Wish()
    v = torch.tensor([w.wanted, -ready_gen, ready_gen, w.stop_at, w.force, w.end_at, int(ckpt_busy), -built_gen,
                      built_gen, -precopy_slices, precopy_slices], dtype=torch.int64, device=_device(group))
    group.allreduce(v, "max")
    wanted, neg_min, mx, stop_at, force, end_at, busy, neg_bmin, bmax, neg_pmin, pmax = (int(x) for x in v.tolist())
    return Cut(wanted=wanted, ready_min=-neg_min, ready_max=mx, stop_at=stop_at, force=force, end_at=end_at,
               ckpt_busy=busy, built_min=-neg_bmin, built_max=bmax, precopy_min=-neg_pmin, precopy_max=pmax)


def confirm(group, committed: int) -> int:
    """Rank 0's decision on a proposed switch, to every rank (the others pass 0): the generation
    committed, or 0 where the controller withdrew it first."""
    v = torch.tensor([committed], dtype=torch.int64, device=_device(group))
    group.allreduce(v, "max")
    return int(v.item())


def _device(group) -> torch.device:
    """Where the boundary's few integers live: a group answered locally (one member), so they stay on
    the host (on a GPU: no copy to the device and back, each a wait, between two steps)."""
    return torch.device("cpu") if group.local else group.device
