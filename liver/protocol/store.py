"""The keys the controller and the workers share, in the job's TCPStore, under ``run/`` and a
prefix made from the job's secret (``protocol/secret.py``): only the job's own processes name them.

- ``gen/{g}``           the generation spec (``messages.GenerationSpec``)
- ``plan/{g}``          the transfer plan into generation g (a pickled ``Plan``, sealed with the job's
                        secret: unpickled only once authenticated), made once by the controller: every
                        process reads it instead of working it out again beside training
- ``ctl``               the controller's current wish (``messages.Wish``)
- ``ctl/version``, ``ctl/{n}``  how many wishes were published, and each one (``Wish.publish``): a
                        worker's courier waits for the next one's key
- ``progress``          the latest finished step (``messages.Progress``, rank 0 of the Active World)
- ``ready/{g}/{proc}``  a process has built and connected its part of generation g (time)
- ``error/{g}/{proc}``  a process could not prepare generation g (``messages.Failure``)
- ``precopy/{g}/{proc}``  the slices of a process's pre-copy of generation g (0: none): every
                        process of the handoff mirrors, or none (``runtime/mirror.py``)
- ``decision/{g}``      whether pending generation g is switched to: "commit" (rank 0 of the Active
                        World, once every rank is ready) or "withdraw" (the controller); whichever is
                        written first holds (one compare-and-set), so both sides know, without
                        waiting, whether a handoff can still happen; sealed with the job's secret (a
                        decision someone else wrote is refused and taken as a withdrawal)
- ``switch/{g}/{proc}`` a process's report of entering generation g (``messages.SwitchReport``,
                        ``messages.StartReport``)
- ``stopped/{g}/{proc}``, ``saved/{g}``  restart mode: each process's stop, and the checkpoint written
"""

from __future__ import annotations

import json
import pickle
import weakref
from typing import Any

import torch.distributed as dist

from liver.protocol.secret import Forged, seal, tag, unseal

PREFIX = "run/"
COMMIT = "commit"
WITHDRAW = "withdraw"


# the job's secret of each store ``run_store`` made: its decisions are sealed with it
_SECRETS: "weakref.WeakKeyDictionary[dist.Store, bytes]" = weakref.WeakKeyDictionary()


def run_store(store: dist.Store, secret: bytes) -> dist.Store:
    """The job's keys in ``store``: under a prefix only the holders of the job's ``secret`` know;
    the handle carries the secret, with which the decisions on it are sealed (``decide``)."""
    keys = dist.PrefixStore(f"{PREFIX}{tag(secret, 'store')}/", store)
    _SECRETS[keys] = secret
    return keys


def put(store: dist.Store, key: str, value: Any) -> None:
    store.set(key, json.dumps(value))


def get(store: dist.Store, key: str, default: Any = None) -> Any:
    """Non-blocking read: ``default`` when the key does not exist."""
    if not store.check([key]):
        return default
    return json.loads(store.get(key))


def decide(store: dist.Store, generation: int, decision: str) -> str:
    """Propose ``decision`` (COMMIT or WITHDRAW) for pending ``generation``; returns the decision
    that holds: this one if it was first, else the one written before it."""
    if decision not in (COMMIT, WITHDRAW):
        raise ValueError(f"decision={decision!r}: allowed {COMMIT!r}, {WITHDRAW!r}")
    key, secret = f"decision/{generation}", _SECRETS.get(store)
    mine = seal(secret, key, decision.encode()) if secret is not None else decision.encode()
    return _opened(store, key, store.compare_set(key, b"", mine))


def decided(store: dist.Store, generation: int) -> str | None:
    """The decision on ``generation`` so far (None: none yet)."""
    key = f"decision/{generation}"
    return _opened(store, key, store.get(key)) if store.check([key]) else None


def _opened(store: dist.Store, key: str, raw: bytes) -> str:
    """A decision as written: one not sealed with the job's secret (a stranger's, who found where
    the job's keys are) is refused, said, and taken as a withdrawal: nothing was committed, the
    Active World trains on, and the controller cancels the handoff."""
    secret = _SECRETS.get(store)
    if secret is None:
        return raw.decode()
    try:
        value = unseal(secret, key, raw).decode()
    except Forged as e:
        print(f"[liver] {e}; the generation is taken as withdrawn", flush=True)
        return WITHDRAW
    if value not in (COMMIT, WITHDRAW):
        return WITHDRAW
    return value


def publish_plan(store: dist.Store, g: int, plan: Any, secret: bytes) -> None:
    """The plan, pickled and sealed with the job's ``secret``."""
    key = f"plan/{g}"
    store.set(key, seal(secret, key, pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)))


def fetch_plan(store: dist.Store, g: int, secret: bytes) -> Any:
    """The controller's plan; ``Forged`` (nothing unpickled) for bytes it did not seal there."""
    key = f"plan/{g}"
    return pickle.loads(unseal(secret, key, store.get(key)))
