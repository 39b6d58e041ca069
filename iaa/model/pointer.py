"""The pointer-sum answer distribution (paper eq. 2), in log space."""

from __future__ import annotations

import torch


def pointer_sum(log_att: torch.Tensor, doc_cand: torch.Tensor, num_cands: int) -> torch.Tensor:
    """log P(a | Q, D) = log Σ_{i ∈ I(a, D)} d_{i,T}, for every candidate a.

    A log-sum-exp per candidate, vectorised with scatters: the per-candidate maximum is
    subtracted before exponentiating (and treated as a constant, which leaves value and gradient
    exact), so a candidate whose attention underflows in probability space keeps a finite log.

    Args:
        log_att: (B, Ld) log d_{i,T}; -inf at padding.
        doc_cand: (B, Ld) int64 candidate index at each position, -1 for none.
        num_cands: C.

    Returns:
        (B, C): -inf for candidates that never occur in the document; no NaN in value or gradient.
    """
    batch = log_att.shape[0]
    slot = doc_cand + 1                                                  # (B, Ld), 0 = no candidate
    peak = log_att.new_full((batch, num_cands + 1), float("-inf"))
    peak = peak.scatter_reduce(1, slot, log_att.detach(), "amax")        # (B, C+1)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    shifted = torch.exp(log_att - peak.gather(1, slot))                  # (B, Ld)
    sums = log_att.new_zeros(batch, num_cands + 1).scatter_add(1, slot, shifted)  # (B, C+1)
    present = sums[:, 1:] > 0
    log_p = torch.log(sums[:, 1:].clamp_min(torch.finfo(sums.dtype).tiny)) + peak[:, 1:]
    return log_p.masked_fill(~present, float("-inf"))                   # (B, C)


def nll_loss(log_p: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Mean of -log P(a* | Q, D) over the batch (the paper's training objective).

    Args:
        log_p: (B, C) from the reader. answer: (B,) int64 gold candidate index.

    An example whose answer never occurs in its document has P(a*) = 0: no pointer model can
    predict it and its loss would be +inf. Such examples are left out of the mean (they get zero
    gradient) instead of turning the whole batch's gradient into NaN; a batch of only such
    examples gives a loss of 0.
    """
    gold = log_p.gather(1, answer.view(-1, 1)).squeeze(1)               # (B,)
    learnable = torch.isfinite(gold)
    total = torch.where(learnable, gold, torch.zeros_like(gold)).sum()
    return -total / learnable.sum().clamp_min(1)


def candidate_probs(log_p: torch.Tensor) -> torch.Tensor:
    """The pointer-sums renormalised over the candidates: a proper distribution, same argmax.

    ``log_p`` holds log P(a | Q, D) of the paper's distribution over *document positions*, whose
    candidates' sums add up to at most 1. Candidates absent from the document (-inf) get exactly
    0; a row where no candidate occurs is all zeros. Never NaN.
    """
    peak = log_p.amax(1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(log_p - peak)                                    # (B, C), 0 if absent
    return weights / weights.sum(1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
