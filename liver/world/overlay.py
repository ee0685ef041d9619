"""torch.distributed's registration of one thread's own: a Shadow World seen as the default group
by the thread that builds on it, while the training thread keeps the Active World's.

DeviceMesh and FSDP2 ask torch.distributed two things of the process: its rank in the default
group (``get_rank()``: a mesh's coordinate, ``mesh["tp"]``) and a group's rank of that global rank
(``get_group_rank``, through ``pg_group_ranks``); its backend (``pg_map``). All read torch's one
``_World`` object, whose
answers belong to the Active World while it trains. A Shadow World numbers processes its own way,
and a communicator it shares with the Active World (``liver/world/sharing.py``) has another
numbering in each. So the companion, to build the next generation's model on its mesh before the
pause, sees its own answers for the duration, in its thread only (``here``): ``_World``'s
``default_pg`` and its maps of registered groups read a thread-local overlay first. Nothing changes for a
thread that has no overlay, nor for any thread once it ends.
"""

from __future__ import annotations

import collections
import contextlib
import threading

import torch.distributed.distributed_c10d as c10d

_local = threading.local()
_installed = False
_install_lock = threading.Lock()
MAPS = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config")
"""The registrations a thread may have of its own (each: a process group -> its entry)."""


def _install() -> None:
    """Make ``_World``'s lookups consult this thread's overlay (once per process)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        cls = type(c10d._world)
        default = cls.default_pg

        def default_pg(self):
            pg = getattr(_local, "default_pg", None)
            return pg if pg is not None else default.fget(self)

        cls.default_pg = property(default_pg, default.fset, doc=default.__doc__)
        for name in MAPS:
            real = getattr(cls, name)

            def lookup(self, real=real, name=name):
                over = getattr(_local, "maps", None)
                mine = real.fget(self)
                return mine if over is None else collections.ChainMap(over[name], mine)

            setattr(cls, name, property(lookup, real.fset, doc=real.__doc__))
        _installed = True


@contextlib.contextmanager
def here(default_pg, maps: dict[str, dict]):
    """For this thread, for the duration: ``default_pg`` is the default group and ``maps`` (one
    dict per name of ``MAPS``) come before torch's own registrations."""
    _install()
    if set(maps) != set(MAPS):
        raise ValueError(f"overlay maps {sorted(maps)}: allowed exactly {list(MAPS)}")
    was = getattr(_local, "default_pg", None), getattr(_local, "maps", None)
    _local.default_pg, _local.maps = default_pg, {k: dict(v) for k, v in maps.items()}
    try:
        yield
    finally:
        _local.default_pg, _local.maps = was
