"""DTensor's sharding propagation, computed in one thread and used in another.

For each operator on DTensors, DTensor works out how its output is laid out (its "sharding
propagation"): milliseconds an operator the first time it meets a mesh and shapes, a lookup after.
Its caches are the calling thread's own (a C++ one at dispatch, a Python one behind it), and
LiveR forgets them at every switch (``forget_meshes``: meshes of two generations compare equal).
So a new generation's first step paid every operator's propagation inside the pause: a tenth to a
fifth of a second for a small model on CPU, most of it in the optimizer's step.

Here the propagation's result is also kept in a table that a thread holds and may hand to
another: the companion computes the new generation's propagation beside training (on the new
mesh, over the model's meta tensors: ``liver/engine/native/ahead.py``) into a fresh table, and the
training thread takes that table at the switch. The C++ cache stays per thread: its misses fall
to the Python side, which finds the table's entry instead of propagating again.

A table is filled in one thread for one World's meshes (``filling``) and read by threads working
on that World (``forget(keep=table)``); it grows only while filled (an optimizer's scalar
arguments make new keys every step: those stay in DTensor's own per-thread cache). A thread with
no table uses DTensor's caching only.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

_here = threading.local()
_installed: bool | None = None
_lock = threading.Lock()


def install() -> bool:
    """Route DTensor's uncached propagation through the calling thread's table (once per process).
    False where this torch has no such entry point (then each thread propagates for itself)."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = _install()
        return _installed


def _install() -> bool:
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._dispatch import _are_we_tracing as tracing
    except ImportError:  # pragma: no cover
        return False
    prop = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    compute = getattr(prop, "propagate_op_sharding_non_cached", None)
    if compute is None:
        return False
    pointwise = getattr(prop, "op_to_schema_info_for_single_dim_strategy", {})
    # two threads now propagate at once (the companion ahead, the training thread): one at a time,
    # as torch asks of threads that both enter its fake-tensor step (re-entrant: a propagation
    # may propagate the operators it decomposes into)
    one_at_a_time = threading.RLock()

    def through_table(compute: Callable[[Any], Any], computed: Callable[[], int]) -> Callable[[Any], Any]:
        def propagate(schema: Any) -> Any:
            table = getattr(_here, "table", None)
            if table is None or tracing():
                return compute(schema)
            try:
                return table[schema]
            except KeyError:
                pass
            except TypeError:  # (a schema that cannot be hashed: computed each time, as DTensor does)
                return compute(schema)
            blind = _scalar_blind(schema, pointwise)
            if blind is not None and blind in table:
                return table[blind]
            before = computed()
            with one_at_a_time:
                out = compute(schema)
            _here.computed = getattr(_here, "computed", 0) + (computed() - before)
            if getattr(_here, "filling", False):  # (else DTensor's own per-thread cache keeps it)
                table[schema] = out
                if blind is not None:
                    table[blind] = out
            return out
        return propagate

    # both of DTensor's ways in: its C++ dispatch's miss (torch 2.13) and its Python cache (the
    # thread's own; torch 2.11's dispatch asks it first), whose own misses count as computed
    calls = [0]

    def counted(schema: Any) -> Any:
        calls[0] += 1
        return compute(schema)
    prop.propagate_op_sharding_non_cached = through_table(counted, lambda: calls[0])
    cached = getattr(prop, "propagate_op_sharding", None)
    if cached is not None and hasattr(cached, "cache_info"):
        prop.propagate_op_sharding = _Cached(cached, through_table(cached, lambda: cached.cache_info().misses))
    return True


class _Cached:
    """DTensor's Python cache behind the table: called through it, cleared and read as before."""

    def __init__(self, cached: Any, call: Callable[[Any], Any]) -> None:
        self._cached, self._call = cached, call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs) if args and not kwargs else self._cached(*args, **kwargs)

    def cache_clear(self) -> None:
        self._cached.cache_clear()

    def cache_info(self) -> Any:
        return self._cached.cache_info()


def _scalar_blind(schema: Any, pointwise: dict) -> tuple | None:
    """A pointwise operator's key without the values of its float arguments (the learning rate,
    Adam's bias corrections: new every step). DTensor's own per-thread cache keys such an operator
    so (checked on torch 2.13: steps whose bias corrections differ propagate nothing after the
    first), so its propagation is the same for any value; the companion's step ran with other
    values than the first step after the switch will. None for any other operator."""
    if schema.op not in pointwise or schema.kwargs_schema:
        return None
    args = schema.args_schema
    if not any(type(a) is float for a in args):
        return None
    try:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
    except ImportError:  # pragma: no cover
        return None
    if not all(type(a) is float or isinstance(a, DTensorSpec) for a in args):
        return None
    return ("scalar-blind", schema.op, tuple(float if type(a) is float else a for a in args))


def forget(keep: dict | None = None) -> None:
    """The calling thread's table is ``keep`` from now (one another thread filled for the World
    this thread now works on), else none: what this thread propagated before is not looked up."""
    if install():
        _here.table, _here.filling, _here.computed = keep, False, 0


@contextlib.contextmanager
def filling() -> Iterator[dict]:
    """A new table for the calling thread, which keeps every propagation it computes for the
    duration (and reads the table after it); yields the table, to hand to another thread."""
    table: dict = {}
    if not install():
        yield table
        return
    _here.table, _here.filling, _here.computed = table, True, 0
    try:
        yield table
    finally:
        _here.filling = False


def computed() -> int:
    """How many propagations the calling thread computed while it held a table (since it took
    one): none, where the table held everything its steps met."""
    return getattr(_here, "computed", 0)
