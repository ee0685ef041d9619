"""Model FLOPs utilisation (MFU), the figure a step line shows on a GPU: the model's FLOPs per
token (its engine's ``ModelFacts.flops_per_token``: for a decoder, 6 per parameter for the forward
and backward matrix multiplies, plus attention's scores), over the accelerator's dense peak for
the dtype the matmuls run in."""

from __future__ import annotations

import torch


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Dense peak of one accelerator, for MFU; None on CPU or an accelerator not known here."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name or "H200" in name or "H800" in name:
        return 989e12 if dtype == "bfloat16" else 67e12
    if "A100" in name or "A800" in name:
        return 312e12 if dtype == "bfloat16" else 19.5e12
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None, devices: int) -> float | None:
    """The share of ``devices`` accelerators' peak that ``tokens_per_s`` of a model of
    ``flops_per_token`` (its ``ModelFacts``) is."""
    if not peak:
        return None
    return flops_per_token * tokens_per_s / (peak * devices)
