"""Reference contents for transfer checks: every element of a logical tensor gets a distinct,
layout-independent value, so a shard moved to the wrong place cannot compare equal.

An element's bit pattern is an odd multiple of its global linear index (plus a per-tensor offset)
modulo 2**(bits-2): a bijection on the indices below that bound, so no two elements of a tensor
share a value, and with the top two bits clear the pattern is never a NaN or an infinity."""

from __future__ import annotations

import zlib

import torch

from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box, local_shape

_BITS = {4: torch.int32, 2: torch.int16, 8: torch.int64}
_MULTIPLIER = 0x9E3779B1  # odd


def reference_shard(spec: TensorSpec, box: Box, device: torch.device) -> torch.Tensor:
    dtype = getattr(torch, spec.dtype)
    width = torch.empty((), dtype=dtype).element_size()
    index = torch.zeros((), dtype=torch.int64)
    stride = 1
    for d in reversed(range(len(spec.shape))):
        lo, hi = box[d]
        shape = [1] * len(spec.shape)
        shape[d] = hi - lo
        index = index + torch.arange(lo, hi, dtype=torch.int64).reshape(shape) * stride
        stride *= spec.shape[d]
    modulus = 1 << (8 * width - 2)
    offset = zlib.crc32(spec.name.encode())
    bits = (index * _MULTIPLIER + offset) % modulus
    out = bits.expand(local_shape(box)).contiguous().to(_BITS[width]).view(dtype)
    return out.to(device)
