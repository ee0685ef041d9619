"""Whether an optimizer's update gives the same bits on a tensor cut into shards as on the tensor
whole (issue 32's ground: a copy of the state on another layout, kept current by replaying each
step's update there, stays bit-exact only for an update that is).

An elementwise update (SGD, Adam, AdamW in their for-loop and foreach forms) in fp32 is, whatever
the cut, as long as it is given the same scalars (learning rate, step, clip coefficient); one whose
kernel rounds an element by where it falls in a vector (torch 2.13's fused AdamW on a CPU; bf16
state in the CPU's vectorised kernels, SGD's momentum among them) or that reduces over a tensor
(Adafactor's row and column statistics, LAMB's trust ratio) is not. This is measured, not assumed:
``invariant`` runs the optimizer both ways on the device and compares every parameter and every
state tensor of the parameter's shape, bit for bit.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

Make = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def invariant(make: Make, shape: tuple[int, ...], cuts: Iterable[int], device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32, steps: int = 3, seed: int = 0) -> bool:
    """Whether ``make``'s optimizer, stepped ``steps`` times with the same gradients on a tensor of
    ``shape`` whole and on its shards cut along the first dimension at ``cuts`` (each shard its own
    parameter), leaves the same bits: the parameter and each state tensor of its shape."""
    g = torch.Generator().manual_seed(seed)
    whole = torch.randn(shape, generator=g).to(device, dtype)
    grads = [torch.randn(shape, generator=g).to(device, dtype) for _ in range(steps)]
    bounds = [0, *sorted(set(cuts)), shape[0]]
    if bounds != sorted(bounds) or any(not 0 <= b <= shape[0] for b in bounds):
        raise ValueError(f"cuts={list(cuts)}: allowed positions from 0 to {shape[0]} along the first dimension")
    one = torch.nn.Parameter(whole.clone())
    parts = [torch.nn.Parameter(whole[a:b].clone()) for a, b in zip(bounds, bounds[1:]) if b > a]
    opt_one, opt_parts = make([one]), make(parts)
    for grad in grads:
        one.grad = grad.clone()
        for p, (a, b) in zip(parts, [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]):
            p.grad = grad[a:b].clone()
        opt_one.step()
        opt_parts.step()
    if not torch.equal(torch.cat([p.detach() for p in parts]), one.detach()):
        return False
    for key, t in opt_one.state[one].items():
        if isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape):
            if not torch.equal(torch.cat([opt_parts.state[p][key] for p in parts]), t):
                return False
    return True


def adamw(**kw) -> Make:
    """torch's AdamW with ``kw`` (``foreach``, ``fused``) and a learning rate and decay that make
    every term of the update count."""
    return lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kw)


ADAMW_FORMS: dict[str, Make] = {"for-loop": adamw(foreach=False), "foreach": adamw(foreach=True),
                                "fused": adamw(fused=True)}
"""The three implementations of torch's AdamW (``torch.optim.AdamW``'s ``foreach``, ``fused``)."""


def report(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
           shape: tuple[int, ...] = (1031, 67), cuts: tuple[int, ...] = (1, 300, 301, 777)) -> dict[str, object]:
    """Each AdamW form's answer on ``device`` for an uneven cut of an odd-sized tensor (shards of 1,
    299, 1, 476 and 254 rows): True, False, or why it could not run there."""
    out: dict[str, object] = {}
    for name, make in ADAMW_FORMS.items():
        try:
            out[name] = invariant(make, shape, cuts, device, dtype)
        except (RuntimeError, ValueError) as e:  # (a form the device's build does not have)
            out[name] = f"not run: {str(e).splitlines()[0][:120]}"
    return out
