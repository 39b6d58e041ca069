"""The one masking helper: softmax over real positions only.

Masks are boolean with True for a real token. Padded positions get exactly 0 probability
(and -inf log-probability), whatever their logits are.
"""

from __future__ import annotations

import torch


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32 at least (bf16 and fp16 become fp32): e.g. logits that reads computed in
    bf16 under autocast, before a normalisation over hundreds of positions."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over the positions where ``mask`` is True; exactly 0 elsewhere.

    Args:
        logits: scores, any shape, e.g. (B, L).
        mask: bool, broadcastable to ``logits``; True for a real position.
        dim: the dimension to normalise over.

    A row with no real position gives all zeros (not NaN), and its logits get zero gradient.
    Computed in fp32 at least (``full_precision``).
    """
    logits = full_precision(logits)
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=dim)
    return probs.masked_fill(~mask, 0.0)


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax over the positions where ``mask`` is True; exactly -inf elsewhere.

    Computed without ``log(softmax)``, so tiny probabilities keep their exact log. A row with no
    real position is all -inf (not NaN), and its logits get zero gradient. In fp32 at least.
    """
    logits = full_precision(logits)
    log_probs = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=dim)
    return log_probs.masked_fill(~mask, float("-inf"))
