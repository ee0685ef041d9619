"""Whether an error is a collective that failed because a peer vanished (a killed process, a lost
node), not a bug of the code that ran it: a step stalls to be healed on it, and a checkpoint write
that fails on it was abandoned with its generation, not refused by its storage."""

from __future__ import annotations

import torch

from liver.world.group import CUT

# ("Application timeout caused pair closure": gloo closed a pair when one of its operations outlived the
# group's timeout, a peer that stopped answering; every later operation on the group says so)
_SIGNS = (CUT, "Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo/transport",
          "NCCL communicator was aborted", "ncclRemoteError", "Application timeout caused pair closure")


def broken_group(e: BaseException) -> bool:
    """A collective that failed because a peer vanished (DCP's gathered failures included), or an
    error raised from one: torch's pipelining wraps what a stage's forward raised (an FSDP2
    all-gather or a TP all-reduce within it, its peer killed) in "[Stage 0] failed to run
    forward", the collective's error its cause; a user's loop may wrap it too."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if _broken(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _broken(e: BaseException) -> bool:
    if isinstance(e, getattr(torch.distributed, "DistError", ())):
        return True
    failures = getattr(e, "failures", None)  # (DCP: each rank's exception, as (exception, traceback))
    if isinstance(failures, dict) and failures:
        return all(broken_group(x[0] if isinstance(x, tuple) else x) for x in failures.values())
    text = str(e)
    return any(s in text for s in _SIGNS)
