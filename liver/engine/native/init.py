"""A recipe's first state: the one its model's own initialisation gives in a plain one-process run.

A plain PyTorch run seeds torch (``torch.manual_seed(seed)``) and builds the model: each module
initialises its own tensors as it is made (``nn.Linear``'s ``reset_parameters``: Kaiming-uniform
weight and bias; ``nn.LayerNorm``'s: ones and zeros; a running statistic's reset), drawing from one
random stream in the order the modules are made. A TorchTitan-style model is built on the meta
device and initialised after by its own ``init_weights``. LiveR computes that same state, on CPU,
in one stream, on every rank, and keeps each rank's box of each tensor: the first state is the
plain run's whatever the layout (TorchTitan's seed checkpoint, made in memory instead of on disk).

By default (``Recipe.init_weights`` not overridden) the model is initialised a unit at a time, so
that no more than one unit is whole in memory: a module with a reset (``reset_parameters``, else
``reset_running_stats``) is a unit with everything below it, its children reset before it (as they
are made before its own reset runs in ``__init__``); a module without one passes its children in
order. A recipe's own ``init_weights(model, job)`` runs over the whole model on CPU.

A ``model()`` that makes modules and then replaces them (``block.norm = nn.LayerNorm(...)`` after
the block was made) draws, in a plain run, for the modules it throws away; LiveR's meta build does
not: make the model's modules as the model keeps them.

A tensor the model's code leaves unset (its storage filled with NaN first, so it shows) is refused
naming it: a parameter made in ``__init__`` from a value (``nn.Parameter(torch.ones(d))``) is not
reproduced on the meta device; give its module a ``reset_parameters``.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

CPU = torch.device("cpu")


def reset_of(mod: nn.Module) -> Callable[[], None] | None:
    for name in ("reset_parameters", "reset_running_stats"):
        f = getattr(mod, name, None)
        if callable(f):
            return f
    return None


def own_tensors(mod: nn.Module, prefix: str, persistent_only: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``mod``'s own parameters and buffers (not its children's), by qualified name."""
    for n, p in mod._parameters.items():
        if p is not None:
            yield (f"{prefix}.{n}" if prefix else n), p
    for n, b in mod._buffers.items():
        if b is not None and not (persistent_only and n in mod._non_persistent_buffers_set):
            yield (f"{prefix}.{n}" if prefix else n), b


def _materialise(mod: nn.Module, recurse: bool) -> None:
    """CPU storage for ``mod``'s tensors (below it too, with ``recurse``), floating ones NaN."""
    mod.to_empty(device=CPU, recurse=recurse)
    with torch.no_grad():
        for m in (mod.modules() if recurse else [mod]):
            for _, t in own_tensors(m, "", persistent_only=False):
                if t.is_floating_point():
                    t.fill_(float("nan"))


def initial_values(model: nn.Module, seed: int, init_weights: Callable[[nn.Module], None] | None,
                   wanted: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each of ``wanted`` (qualified names of parameters and persistent buffers of ``model``, a
    whole model built on the meta device: it is materialised and freed here) with its initial
    value as a whole CPU tensor, as the plain run makes it (see the module's docstring).
    ``init_weights``: the recipe's over the whole model, or None for the modules' own resets."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.no_grad():
            if init_weights is not None:
                _materialise(model, recurse=True)
                init_weights(model)
                yield from _checked(model, "", wanted)
                return
            yield from _walk(model, "", wanted)


def _walk(mod: nn.Module, prefix: str, wanted: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    reset = reset_of(mod)
    if reset is not None:  # a unit: its subtree whole, children's resets first, then its own
        _materialise(mod, recurse=True)
        _reset_below(mod)
        reset()
        yield from _checked(mod, prefix, wanted)
        mod.to_empty(device="meta", recurse=True)
        return
    for name, child in mod.named_children():
        yield from _walk(child, f"{prefix}.{name}" if prefix else name, wanted)
    if any(True for _ in own_tensors(mod, prefix)):
        _materialise(mod, recurse=False)
        yield from _checked(mod, prefix, wanted, recurse=False)
        mod.to_empty(device="meta", recurse=False)


def _reset_below(mod: nn.Module) -> None:
    """The resets of ``mod``'s descendants, each child's subtree in order, a module after its children."""
    for child in mod.children():
        _reset_below(child)
        r = reset_of(child)
        if r is not None:
            r()


def _checked(mod: nn.Module, prefix: str, wanted: set[str], recurse: bool = True):
    seen: set[int] = set()
    for m_prefix, m in (mod.named_modules(prefix=prefix) if recurse else [(prefix, mod)]):
        for name, t in own_tensors(m, m_prefix):
            if name not in wanted or id(t) in seen:
                continue
            seen.add(id(t))
            if t.is_floating_point() and torch.isnan(t).any():
                raise ValueError(f"tensor {name!r} is not initialised by the model's own code (its module "
                                 f"{type(m).__name__} has no reset_parameters, and the recipe defines no "
                                 f"init_weights): give the module a reset_parameters (or the recipe an "
                                 f"init_weights(model, job)) that sets it")
            yield name, t
