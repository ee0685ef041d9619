"""Fault injection at named points of a worker, for the fault-matrix tests: the faults that cannot
be timed from outside a process (a destination that dies in the middle of a transfer, a switch
that lasts long enough for an event to arrive during it, a disk that fills under a checkpoint).

``LIVER_FAULT="POINT:PROC[:ARG],..."`` in a worker's environment arms POINT in process PROC:

- ``transfer:PROC[:LAYER]``   the process kills itself (SIGKILL) in a switch's transfer, after its
  LAYER-th layer (default 0): a peer mid-stream, as a lost machine is;
- ``slow-transfer:PROC:S``    its transfer stalls S seconds after its first layer;
- ``mid-step:PROC[:STEP]``     the process kills itself in step STEP (default: its first): the
  reference engine once its backward is done and before the gradients' reductions, a user's model
  as it takes the step's batch; its peers go on into the step and are left holding the gradients of
  an attempt that cannot complete (a heal re-runs it);
- ``reduced:PROC[:STEP]``      the reference engine kills itself in step STEP once the data-parallel
  reduction of its gradients is done, before its tensor-parallel peers reduce the gradient norm:
  the other replicas complete the step, its own peers stop a step behind them;
- ``precopy:PROC[:STEP]``     the process kills itself at the STEP-th step it mirrors (a pre-copy:
  liver/runtime/mirror.py; default: at its first slice's copy): an old rank after its update, a cold
  joiner that follows when it is told of the step;
- ``disk-full:PROC[:STEP]``   every periodic checkpoint write of the steps from STEP on fails as a
  full disk fails (``OSError(ENOSPC)`` from the storage layer once this process's files are
  written, before DCP's metadata is): the disk stays full;
- ``drift:PROC[:STEP]``        after step STEP the process moves one element of its first replicated
  parameter by one unit in the last place, once: a framework that lets its replicas drift apart
  (Megatron's tensor-parallel copies of a norm weight were seen to, bench/results/gpu-1x-netns-
  nccl-two-nodes), for the digest's check to find;
- ``announce:GEN[:S]``        the controller (here the number is a generation, not a process) kills
  itself (SIGKILL) once it has announced generation GEN (its spec and plan published, its joiners
  asked for, the ranks told), before its journal's next write, as a controller that dies there does;
  with S, at its first pass S seconds after (the joiners started, the ranks preparing).

Unset (every real run), each point costs one dictionary look-up.
"""

from __future__ import annotations

import errno
import os
import signal
import time

ENV = "LIVER_FAULT"
POINTS = ("transfer", "slow-transfer", "disk-full", "mid-step", "reduced", "precopy", "drift", "announce")
_me: list[int] = [-1]  # this process's id, for points reached where it is not known (an engine's step)


def parse(text: str) -> dict[tuple[str, int], str]:
    """``POINT:PROC[:ARG],...`` -> {(point, proc): arg}; ValueError naming what is wrong."""
    out: dict[tuple[str, int], str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        point, _, rest = item.partition(":")
        proc, _, arg = rest.partition(":")
        if point not in POINTS or not proc.isdigit():
            raise ValueError(f"{ENV}={text!r}: {item!r}: allowed POINT:PROC[:ARG] with POINT one of "
                             f"{', '.join(POINTS)} and PROC a process id")
        out[(point, int(proc))] = arg
    return out


_armed = parse(os.environ.get(ENV, ""))


def arm(text: str) -> None:
    """Arm the points of ``text`` in this process (what the environment does at import)."""
    _armed.clear()
    _armed.update(parse(text))


def armed(point: str, proc: int) -> bool:
    return (point, proc) in _armed


def once(point: str, proc: int, index: int) -> bool:
    """Whether ``point``, armed for ``proc``, fires now (``index`` reached its ARG): once."""
    if _reached(point, proc, index) is None:
        return False
    del _armed[(point, proc)]
    return True


def _reached(point: str, proc: int, index: int) -> str | None:
    """The ARG of ``point`` armed for ``proc`` once ``index`` has reached it, else None."""
    arg = _armed.get((point, proc)) if _armed else None
    return None if arg is None or index < (float(arg or 0) if point != "slow-transfer" else 0) else arg


def identify(proc: int) -> None:
    """This process is ``proc`` (a worker says so once it starts)."""
    _me[0] = proc


def here(point: str, index: int = 0) -> None:
    """``at`` for this process (``identify``)."""
    if _armed:
        at(point, _me[0], index)


def at(point: str, proc: int, index: int = 0) -> None:
    """The fault armed at ``point`` for ``proc``, if any, once ``index`` (a layer, a step) reaches
    its ARG; a kill or a stall fires once, a full disk at every write."""
    arg = _reached(point, proc, index)
    if arg is None:
        return
    if point in ("transfer", "mid-step", "reduced", "precopy", "announce"):
        del _armed[(point, proc)]
        os.kill(os.getpid(), signal.SIGKILL)
    elif point == "slow-transfer":
        del _armed[(point, proc)]
        time.sleep(float(arg or 1.0))
    elif point == "disk-full":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
