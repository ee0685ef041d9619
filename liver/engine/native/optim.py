"""What a recipe's optimizer keeps per parameter, found by stepping it once over stand-ins.

``torch.optim`` optimizers make their state at their first step, each its own: Adam's moments,
SGD's momentum buffer (with momentum), Adagrad's sums, RMSprop's averages, Rprop's step sizes, and
0-dim counters (``step``, NAdam's ``mu_product``, ASGD's ``eta``). LiveR moves every tensor shaped
like its parameter with that parameter (live and through DCP), and carries each 0-dim one as one
value for the whole optimizer. Which keys an optimizer has, it learns before any process starts:
the recipe's optimizer is built over the recipe's own model with every parameter replaced by a
small CPU stand-in of its rank and dtype, stepped once with zero gradients, and its state read.
What it cannot describe (state that is neither, an optimizer that cannot step without a closure)
is refused, naming the optimizer and the key.

At a first start the optimizer makes its own state at its first step, with its own initial values
(Adagrad's ``initial_accumulator_value``, Rprop's step size); a generation that receives state
(a switch, a checkpoint's load) has it made here first, for the transfer to write into.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class OptimizerState:
    """The per-parameter state of one optimizer: ``tensors`` shaped like their parameter (each
    with its dtype, None: the parameter's), ``scalars`` 0-dim, carried as one value each."""

    optimizer: str
    tensors: tuple[tuple[str, torch.dtype | None], ...]
    scalars: tuple[tuple[str, torch.dtype], ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.tensors)

    def make(self, optimizer: torch.optim.Optimizer, group: dict, param: torch.Tensor,
             like: dict[str, torch.Tensor]) -> None:
        """``param``'s state (of param group ``group``) as the optimizer would hold it after a step
        (values to be written: every caller writes each of them next, so new storage is left
        unfilled): ``like[key]`` (adopted storage) where given, else new; counters at 0."""
        st = optimizer.state[param]
        on_device = bool(group.get("fused") or group.get("capturable"))  # (torch's own rule for counters)
        for key, dtype in self.scalars:
            st.setdefault(key, torch.zeros((), dtype=dtype, device=param.device if on_device else "cpu"))
        for key, dtype in self.tensors:
            if key not in st:
                st[key] = like[key] if key in like else torch.empty_like(
                    param, dtype=dtype or param.dtype, memory_format=torch.preserve_format)


def describe(optimizer_of, model: nn.Module, recipe_name: str) -> OptimizerState:
    """``optimizer_of(model)``'s state per parameter, from one step over stand-ins of ``model``'s
    parameters (``model`` is changed: pass one built for this, on the meta device)."""
    opt = optimizer_over_stand_ins(optimizer_of, model)
    what = f"the optimizer {type(opt).__name__} of the recipe {recipe_name!r}"
    params = [p for g in opt.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    for check in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
        if hasattr(opt, check):  # (it asks the accelerator whether a graph is captured: a CUDA context in
            setattr(opt, check, lambda: None)  # the worker template, which must fork without one)
    try:
        opt.step()
    except Exception as e:
        raise ValueError(f"{what}: one step over stand-ins of the parameters failed ({type(e).__name__}: {e}), so "
                         f"its state cannot be described; allowed: optimizers that step without a closure") from None
    tensors: dict[str, torch.dtype | None] = {}
    scalars: dict[str, torch.dtype] = {}
    for p in params:
        for key, v in opt.state.get(p, {}).items():
            if not isinstance(v, torch.Tensor):
                raise ValueError(f"{what}: state {key!r} is a {type(v).__name__}: allowed tensors shaped like their "
                                 f"parameter, and 0-dim counters")
            if v.dim() == 0 and (p.dim() > 0 or key in scalars):
                scalars[key] = v.dtype
            elif tuple(v.shape) == tuple(p.shape):
                tensors[key] = None if v.dtype == p.dtype else v.dtype
            else:
                raise ValueError(f"{what}: state {key!r} has shape {tuple(v.shape)} for a parameter of shape "
                                 f"{tuple(p.shape)}: allowed tensors shaped like their parameter, and 0-dim counters")
    both = sorted(set(tensors) & set(scalars))
    if both:
        raise ValueError(f"{what}: state {both[0]!r} is 0-dim for some parameters and not for others")
    return OptimizerState(type(opt).__name__, tuple(sorted(tensors.items())), tuple(sorted(scalars.items())))


def _stand_ins(model: nn.Module) -> dict[int, str]:
    """``model``'s parameters replaced by small CPU stand-ins of their rank and dtype; the stand-ins'
    ids to their qualified names."""
    stand: dict[int, nn.Parameter] = {}
    names: dict[int, str] = {}
    for prefix, mod in model.named_modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in stand:
                stand[id(p)] = nn.Parameter(torch.zeros((2,) * p.dim(), dtype=p.dtype), p.requires_grad)
                names[id(stand[id(p)])] = f"{prefix}.{name}" if prefix else name
            mod._parameters[name] = stand[id(p)]
    return names


def optimizer_over_stand_ins(optimizer_of, model: nn.Module) -> torch.optim.Optimizer:
    """``optimizer_of(model)`` over CPU stand-ins of ``model``'s parameters (``model`` is changed:
    pass one built for this, on the meta device): its class and its groups' options."""
    _stand_ins(model)
    return optimizer_of(model)


def groups_of(optimizer_of, model: nn.Module) -> dict[str, int]:
    """Each parameter's group in ``optimizer_of(model)`` by qualified name (``model`` is changed:
    pass one built for this, on the meta device)."""
    names = _stand_ins(model)
    opt = optimizer_of(model)
    return {names[id(p)]: i for i, g in enumerate(opt.param_groups) for p in g["params"] if id(p) in names}


class OptimizerReplay:
    """A recipe's optimizer update replayed on shards of another layout (a pre-copy's mirror,
    liver/runtime/mirror.py): a new optimizer of the same class over the shards (plain tensors),
    each in its parameter's group with that group's options now (``Update.groups``), its state the
    shards' moments and the running optimizer's counters before its step (``Update.counters``);
    stepped once. Parameters and optimizer state change only through the update; a persistent
    buffer (the forward pass writes it) does not, and streams at the switch."""

    def __init__(self, cls: type, group: dict[str, int], state: OptimizerState, params: frozenset[str]) -> None:
        self.cls, self.group, self.state, self.params = cls, group, state, params

    def replayable(self, name: str) -> bool:
        base, _, key = name.rpartition(".")
        return name in self.params or (base in self.params and key in self.state.keys)

    @torch.no_grad()
    def __call__(self, shards: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], update) -> None:
        by_group: dict[int, list[str]] = {}
        for n in grads:
            by_group.setdefault(self.group[n], []).append(n)
        groups, params = [], {}
        for i, names in sorted(by_group.items()):
            ps = []
            for n in names:
                p = params[n] = nn.Parameter(shards[n], requires_grad=False)
                p.grad = grads[n]
                ps.append(p)
            groups.append({**update.groups[i], "params": ps})
        opt = self.cls(groups)
        counters = dict(update.counters)
        for i, names in sorted(by_group.items()):
            on_device = bool(update.groups[i].get("fused") or update.groups[i].get("capturable"))
            for n in names:
                p = params[n]
                st = opt.state[p]
                for key, dtype in self.state.scalars:
                    if key in counters:
                        st[key] = torch.tensor(counters[key], dtype=dtype, device=p.device if on_device else "cpu")
                for key, _ in self.state.tensors:
                    st[key] = shards[f"{n}.{key}"]
        opt.step()
