"""A worker's guard over its own standing in the job: fenced, or cut off.

The controller fences the processes of a node it declared lost (``protocol.messages.Fence``):
whatever still runs there (its agent was only stopped, or its link came back) must never train
again in any generation, and its peers must not wait on it. One thread per worker, on a store
connection of its own, blocked on the next fence's key:

- a fence naming this process: it says so and ends at once (``FENCED``), its courier posting
  nothing more, so no step it takes after being declared lost is counted or logged as the job's;
- a fence naming a process of the generation it trains in: ``on_peer`` (the member cuts its
  connections, ``World.interrupt``), so a collective blocked on the lost peer fails now and it
  stalls to be healed, instead of waiting the group's timeout on a node that will never answer;
- no contact with the job's store for ``orphan_after_s`` (its node is cut off, or the
  controller's node is gone), or its agent gone that long (killed: were its controller gone too,
  no one would stop it, the store's own process keeping its heartbeat answered): it ends by
  itself (``ORPHANED``), never training on unobserved.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from liver.host.process import ProcessRef
from liver.protocol.messages import Fence, read

FENCED = 75    # its exit status: it was declared lost (its steps since are not the job's)
ORPHANED = 76  # its exit status: it lost the job's store for longer than its timeout
_WAIT = timedelta(days=365)  # (a fence may never come)
_TICK_S = 0.5


class Guard:
    def __init__(self, store: dist.Store, proc: int, on_peer: Callable[[Fence], None],
                 orphan_after_s: float, contact: Callable[[], float], stop_posting: Callable[[], None],
                 agent: ProcessRef | None = None) -> None:
        """``on_peer(fence)``: a fence of other processes (the member decides whether they are its
        generation's); ``contact()``: when the job's store last answered this process (its
        heartbeat); ``stop_posting()``: its step records go out no more; ``agent``: the process
        of the node agent that started it (None: not watched). Two threads: one blocked
        on the next fence, one reading the contact clock (a store call blocks on a link that is
        cut: torch's TCPStore cancels a timed-out wait with a request it waits on unbounded)."""
        self._store, self._proc, self._on_peer = store, proc, on_peer
        self._orphan_after_s, self._contact, self._stop_posting = orphan_after_s, contact, stop_posting
        self._agent = agent
        threading.Thread(target=self._watch, name="liver-fence", daemon=True).start()
        if orphan_after_s:
            threading.Thread(target=self._clock, name="liver-orphan", daemon=True).start()

    def _watch(self) -> None:
        n = 0
        while True:
            try:
                self._store.wait([Fence.version_key(n + 1)], _WAIT)
            except RuntimeError:  # (the store went away: the job ends, or the contact clock stops it)
                return
            n += 1
            try:
                fence = read(self._store, Fence.version_key(n), Fence)
            except (RuntimeError, ValueError) as e:  # (a fence that cannot be read is said, not obeyed)
                print(f"[liver] proc {self._proc}: fence {n} unreadable: {e}", flush=True)
                continue
            if self._proc in fence.procs:
                self._end(FENCED, f"its node {fence.node} was declared lost by the controller; it stops "
                                  f"without another step")
            try:
                self._on_peer(fence)
            except Exception as e:  # (the guard never ends on a peer's fence: said, and it watches on)
                print(f"[liver] proc {self._proc}: fence {n} of {list(fence.procs)}: {type(e).__name__}: {e}",
                      flush=True)

    def _clock(self) -> None:
        agent_gone: float | None = None
        while True:
            time.sleep(_TICK_S)
            now = time.time()
            silent = now - self._contact()
            if silent > self._orphan_after_s:
                self._end(ORPHANED, f"no answer from the job's store for {silent:.0f} s (its node is cut off, or "
                                    f"the controller's is gone); it stops rather than train unobserved")
            if self._agent is not None and agent_gone is None and not self._agent.alive():
                agent_gone = now
                print(f"[liver] proc {self._proc}: its agent (pid {self._agent.pid}) is gone; it stops in "
                      f"{self._orphan_after_s:g} s unless fenced first", flush=True)
            if agent_gone is not None and now - agent_gone > self._orphan_after_s:
                self._end(ORPHANED, f"its agent (pid {self._agent.pid}) has been gone for {now - agent_gone:.0f} s; "
                                    f"it stops rather than train where no one can stop it")

    def _end(self, code: int, why: str) -> None:
        self._stop_posting()
        print(f"[liver] proc {self._proc}: {why}", flush=True)
        sys.stdout.flush()
        os._exit(code)  # (its groups may be blocked on peers: nothing waits for them)


__all__ = ["FENCED", "Guard", "ORPHANED"]
