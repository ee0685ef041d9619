"""Cutting a process's connections to its peers from outside the thread that uses them.

A collective blocked on a peer that will never answer (its node frozen, or cut off: no FIN and
no RST ever arrive) waits for the group's timeout, minutes. Gloo's ``abort`` does not wake it
(checked on torch 2.11 and 2.13: an all-reduce blocked in one thread stays blocked when another
aborts its group). Shutting the TCP connections down does: the blocked receive fails at once
("Connection closed by peer"), which the training loop takes for a broken group and stalls on
(``engine.loop``), so a fenced peer (``runtime.fence``) is excluded as soon as it is declared lost.

Every connected TCP socket of the process is shut down except those to the job's store (its
port): the store carries the heal that follows. Linux only (``/proc/self/fd``); elsewhere nothing
is cut and the collective fails at the group's timeout, as before.
"""

from __future__ import annotations

import os
import socket

_INET = (socket.AF_INET, socket.AF_INET6)


def sever(keep_ports: set[int]) -> int:
    """Shut down every connected TCP socket of this process whose peer's port is not in
    ``keep_ports``; returns how many. The descriptors stay open (their owners close them)."""
    try:
        fds = [int(f) for f in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    cut = 0
    for fd in fds:
        try:
            s = socket.socket(fileno=fd)
        except OSError:  # not a socket (or closed since the listing)
            continue
        try:
            if s.type != socket.SOCK_STREAM or s.family not in _INET:
                continue
            try:
                port = s.getpeername()[1]
            except OSError:  # listening, or not connected
                continue
            if port not in keep_ports:
                s.shutdown(socket.SHUT_RDWR)
                cut += 1
        except OSError:
            pass
        finally:
            s.detach()  # (the descriptor is its owner's)
    return cut


__all__ = ["sever"]
