"""Dropout with a cheap random mask, in place of ``F.dropout`` (CPU).

Why: ``F.dropout`` spends most of its time drawing a Bernoulli sample per element, a sizeable
part of the straightforward reader's training step on a CPU (profiled). The fast path draws one
64-bit random integer per four elements and compares each 16-bit lane with a threshold, which
makes mask, multiply and backward together cheaper (measured: benchmarks/HISTORY.md,
"Measurements cited from the code"). The keep probability is quantised to 1/65536 (p = 0.2
becomes 13107/65536 = 0.199997); the scale is 1/keep of that exact keep probability, so
E[output] = input holds exactly. The mask is kept as uint8 (1 byte per element) for backward.
"""

from __future__ import annotations

import torch

from iaa.model.kernels.support import Support

_LANES = 65536


def dropout_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[torch.Tensor, float]:
    """A 0/1 uint8 keep-mask of ``shape`` with P(drop) = round(p * 65536) / 65536, and its scale."""
    threshold = round(p * _LANES)
    numel = 1
    for size in shape:
        numel *= size
    # random_(min, None) draws all 64 bits; plain random_() leaves the sign bit 0, which would
    # bias every fourth lane.
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    lanes = words.view(torch.int16)[:numel]                       # uniform over [-32768, 32767]
    keep = (lanes >= (threshold - _LANES // 2)).view(torch.uint8)        # 0/1: x * uint8 is several
    return keep.view(shape), _LANES / (_LANES - threshold)                 # times faster than x * bool


class _MaskedScale(torch.autograd.Function):
    """y = x * keep * scale, with the same mask and scale in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


class FastDropout:
    """Inverted dropout with a mask drawn from 16-bit random lanes (see the module docstring)."""

    slot, switch = "dropout", "fast_dropout"
    support = Support(devices=frozenset({"cpu"}))

    @classmethod
    def make(cls, cfg, precision: str) -> "FastDropout":
        return cls()

    def __call__(self, x: torch.Tensor, p: float) -> torch.Tensor:
        """``F.dropout(x, p, training=True)`` in distribution: each element kept with
        probability 1 - p (quantised to 1/65536) and scaled by 1/keep."""
        keep, scale = dropout_mask(x.shape, p, x.device)
        return _MaskedScale.apply(x, keep, scale)
