"""The reference Llama-style decoder (RMSNorm, RoPE, SwiGLU), written as functions over a dict of
local parameter shards so that a pipeline stage holds only its own layers and a TP rank only its
own slices. Each rank creates its shards directly on its device; values depend only on the seed,
the tensor name and the global element index, never on the layout.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F

from liver.engine.reference.tensor_parallel import (copy_to_tp, reduce_from_tp, vocab_parallel_cross_entropy,
                                          vocab_parallel_embedding)
from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box, local_shape
from liver.topology.config import ModelConfig
from liver.world.group import Group


def param_specs(m: ModelConfig) -> list[TensorSpec]:
    """The model's parameters as logical tensors, in canonical (streaming) order."""
    h, f, v = m.hidden_size, m.ffn_size, m.padded_vocab_size
    specs = [TensorSpec("embed.weight", (v, h), "float32", -1, 0)]
    for i in range(m.num_layers):
        p = f"layers.{i}."
        specs += [
            TensorSpec(p + "attn_norm.weight", (h,), "float32", i, None),
            TensorSpec(p + "attn.wq", (h, h), "float32", i, 0),
            TensorSpec(p + "attn.wk", (h, h), "float32", i, 0),
            TensorSpec(p + "attn.wv", (h, h), "float32", i, 0),
            TensorSpec(p + "attn.wo", (h, h), "float32", i, 1),
            TensorSpec(p + "mlp_norm.weight", (h,), "float32", i, None),
            TensorSpec(p + "mlp.w_gate", (f, h), "float32", i, 0),
            TensorSpec(p + "mlp.w_up", (f, h), "float32", i, 0),
            TensorSpec(p + "mlp.w_down", (h, f), "float32", i, 1),
        ]
    specs += [TensorSpec("final_norm.weight", (h,), "float32", m.num_layers, None),
              TensorSpec("head.weight", (v, h), "float32", m.num_layers, 0)]
    return specs


# ---- layout-independent initialisation ---------------------------------------------------------
_M64 = (1 << 64) - 1


def _s64(c: int) -> int:
    c &= _M64
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _hash_uniform(key: int, idx: torch.Tensor) -> torch.Tensor:
    """splitmix64 of (key, idx) -> uniform floats in [0, 1) with 24 bits."""
    x = idx * _s64(0x9E3779B97F4A7C15) + _s64(key)
    x = (x ^ _shr(x, 30)) * _s64(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _s64(0x94D049BB133111EB)
    x = x ^ _shr(x, 31)
    return _shr(x, 40).to(torch.float32) * (1.0 / (1 << 24))


def init_shard(spec: TensorSpec, box: Box, m: ModelConfig, seed: int,
               device: torch.device) -> torch.Tensor:
    """The values of ``box`` of ``spec`` at initialisation (uniform with the configured std)."""
    shape = local_shape(box)
    if spec.name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.float32, device=device)
    std = m.init_std
    if spec.name.endswith(("attn.wo", "mlp.w_down")):
        std /= math.sqrt(2 * m.num_layers)
    key = int.from_bytes(hashlib.sha256(f"{seed}/{spec.name}".encode()).digest()[:8], "little")
    out = torch.empty(shape, dtype=torch.float32, device=device)
    (r0, r1), cols = box[0], box[1:]
    row_stride = math.prod(spec.shape[1:])
    col = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for d in range(len(cols) - 1, -1, -1):  # linear offset inside a row, for the box's columns
        lo, hi = cols[d]
        ar = torch.arange(lo, hi, dtype=torch.int64, device=device) * stride
        col = ar.reshape([-1] + [1] * (len(cols) - 1 - d)) + col
        stride *= spec.shape[1 + d]
    rows_per_chunk = max(1, (1 << 22) // max(1, math.prod(shape[1:])))
    for a in range(r0, r1, rows_per_chunk):
        b = min(r1, a + rows_per_chunk)
        rows = torch.arange(a, b, dtype=torch.int64, device=device) * row_stride
        idx = rows.reshape([-1] + [1] * len(cols)) + col
        out[a - r0:b - r0] = (_hash_uniform(key, idx) * 2.0 - 1.0) * (std * math.sqrt(3.0))
    return out


# ---- forward ------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype)


def rope_tables(m: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    half = m.head_dim // 2
    inv = 1.0 / (m.rope_theta ** (torch.arange(half, dtype=torch.float32, device=device) / half))
    ang = torch.arange(m.seq_len, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, s, d]; rotate-half form."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    c, s = cos[: x.shape[-2]], sin[: x.shape[-2]]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def block(x: torch.Tensor, p: dict[str, torch.Tensor], i: int, m: ModelConfig, tp: Group,
          rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One transformer block on local shards: x [b, s, h] (replicated over TP)."""
    pre = f"layers.{i}."
    b, s, _ = x.shape
    heads = m.num_heads // tp.size
    h = copy_to_tp(rms_norm(x, p[pre + "attn_norm.weight"], m.norm_eps), tp)

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, heads, m.head_dim).transpose(1, 2)

    q = apply_rope(split(F.linear(h, p[pre + "attn.wq"])), *rope)
    k = apply_rope(split(F.linear(h, p[pre + "attn.wk"])), *rope)
    v = split(F.linear(h, p[pre + "attn.wv"]))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    o = o.transpose(1, 2).reshape(b, s, heads * m.head_dim)
    x = x + reduce_from_tp(F.linear(o, p[pre + "attn.wo"]), tp)
    h = copy_to_tp(rms_norm(x, p[pre + "mlp_norm.weight"], m.norm_eps), tp)
    a = F.silu(F.linear(h, p[pre + "mlp.w_gate"])) * F.linear(h, p[pre + "mlp.w_up"])
    return x + reduce_from_tp(F.linear(a, p[pre + "mlp.w_down"]), tp)


def embed(ids: torch.Tensor, p: dict[str, torch.Tensor], tp: Group) -> torch.Tensor:
    w = p["embed.weight"]
    return vocab_parallel_embedding(ids, w, tp.rank * w.shape[0], tp)


def head_loss(x: torch.Tensor, target: torch.Tensor, p: dict[str, torch.Tensor], m: ModelConfig,
              tp: Group) -> torch.Tensor:
    """Mean cross-entropy over the micro-batch's tokens."""
    h = copy_to_tp(rms_norm(x, p["final_norm.weight"], m.norm_eps), tp)
    w = p["head.weight"]
    logits = F.linear(h, w).flatten(0, 1)
    loss = vocab_parallel_cross_entropy(logits, target.flatten(), tp.rank * w.shape[0],
                                        m.vocab_size, tp)
    return loss.mean()
