"""Adaptive Computation Time (Graves 2016, section 2) over the reader's inference steps.

The paper fixes T and leaves open "to dynamically select the number of inference steps
conditioned on each example". With ACT each step t = 1..T_max gives

    h_t = σ(w · s_t + b_t)                      halting probability, from the state after step t
    N   = min{n : Σ_{t≤n} h_t ≥ 1 - ε}          the step the example stops at (T_max at most)
    R   = 1 - Σ_{t<N} h_t                       the remainder
    p_t = h_t for t < N,  R for t = N,  0 after

and the answer distribution is the mixture Σ_t p_t d_{i,t} of the steps' document attentions,
which the pointer-sum then reads (its sums are linear in d, so this is also the mixture of the
steps' pointer-sums). The ponder cost N + R (R carries the gradient; N is a step count) is
added to the loss with weight τ (``model.ponder_cost``).

``b_t`` is one bias per step t < T_max (Graves has one in all; no unit runs at T_max): it lets the unit learn a prior over the
number of steps, and driving b_t to -∞ for t < k and +∞ at k makes the reader stop at step k
exactly. The biases start at ``model.halt_bias_init`` (default -1: h_t ≈ 0.27, so about four
steps at first). At 0, h_t ≈ 0.5 and every example stops at step 2 from the start (0.5 + 0.5 ≥
1 - ε), a point that ACT's gradient, which moves only R and the p_t, does not leave easily.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from iaa.model.attention import Encodings
from iaa.model.masking import full_precision

EPSILON = 0.01  # ε: an example halts once its halting probabilities reach 1 - ε (Graves 2016)


class HaltingUnit(nn.Module):
    """h_t = σ(w · s_t + b_t).

    Args:
        state_dim: s, the inference GRU's state size. steps: T_max (one bias per step).
    """

    def __init__(self, state_dim: int, steps: int) -> None:
        super().__init__()
        self.proj = nn.Linear(state_dim, 1, bias=False)            # w
        self.bias = nn.Parameter(torch.zeros(steps - 1))            # b_t, t < T_max

    def forward(self, s: torch.Tensor, step: int) -> torch.Tensor:
        """s: (B, s) the state after step ``step`` (0-based). Returns h_t: (B,), fp32 (it is summed
        and compared with 1 - ε)."""
        return torch.sigmoid(full_precision(self.proj(s).squeeze(-1)) + self.bias[step])


def halting_weights(h: torch.Tensor, spent: torch.Tensor, last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ACT rule at one step, for examples still running.

    Args:
        h: (A,) h_t (ignored at the last step, where every example halts).
        spent: (A,) Σ_{t'<t} h_t', the halting probability already spent.
        last: whether t = T_max.

    Returns:
        p_t (A,), the step's weight in the mixture: h_t, or R = 1 - spent where the example
        halts; and halts (A,) bool.
    """
    halts = spent + h >= 1.0 - EPSILON
    if last:
        halts = torch.ones_like(halts)
    return torch.where(halts, 1.0 - spent, h), halts


@dataclass(frozen=True)
class Halting:
    """What ACT decided for a batch of B examples over the n ≤ T_max steps computed.

    ``probs`` and ``weights`` are 0 after an example's stop, and ``probs`` is 0 at T_max, where
    no halting unit runs (the example halts there whatever it would say).
    """

    probs: torch.Tensor      # (B, n) h_t
    weights: torch.Tensor    # (B, n) p_t; each row sums to 1
    steps: torch.Tensor      # (B,) N, int64, 1-based
    remainder: torch.Tensor  # (B,) R

    @property
    def ponder(self) -> torch.Tensor:
        """N + R: (B,), differentiable through R."""
        return self.steps.to(self.remainder.dtype) + self.remainder


def mixture_log(log_weights: torch.Tensor, log_att: torch.Tensor) -> torch.Tensor:
    """log Σ_t p_t d_{i,t}: the ACT answer distribution, in log space.

    Args:
        log_weights: (n, B) log p_t, -inf where p_t = 0.
        log_att: (n, B, Ld) log d_{i,t}, -inf at masked positions.

    Returns:
        (B, Ld), -inf where every term is -inf; no NaN in value or gradient (the maximum is
        subtracted as a constant, as in ``pointer_sum``).
    """
    terms = log_weights.unsqueeze(-1) + log_att                      # (n, B, Ld)
    peak = terms.detach().amax(0)                                     # (B, Ld)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    sums = torch.exp(terms - peak).sum(0)                             # (B, Ld)
    log_mix = torch.log(sums.clamp_min(torch.finfo(sums.dtype).tiny)) + peak
    return log_mix.masked_fill(sums == 0, float("-inf"))


def safe_log(p: torch.Tensor) -> torch.Tensor:
    """log p, exactly -inf where p = 0, with a finite gradient everywhere."""
    return torch.where(p > 0, torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)), float("-inf"))


@dataclass
class Running:
    """The rows of a batch that the ACT loop still computes, with their per-row state."""

    rows: torch.Tensor       # (A,) int64 indices into the batch
    alive: torch.Tensor      # (A,) bool: not halted yet
    spent: torch.Tensor      # (A,) Σ h_t so far
    s: torch.Tensor          # (A, s) inference state
    q_enc: torch.Tensor      # (A, Lq, 2h)
    q_mask: torch.Tensor     # (A, Lq)
    d_enc: Encodings         # (A, Ld, 2h), or a kernel's reads of them
    d_mask: torch.Tensor     # (A, Ld)
    a_mask: torch.Tensor     # (A, Ld) answer positions

    @classmethod
    def start(cls, q_enc: torch.Tensor, d_enc: Encodings, q_mask: torch.Tensor, d_mask: torch.Tensor,
              a_mask: torch.Tensor, state_dim: int) -> "Running":
        n, device = q_enc.shape[0], q_enc.device
        return cls(torch.arange(n, device=device), torch.ones(n, dtype=torch.bool, device=device),
                   q_enc.new_zeros(n), q_enc.new_zeros(n, state_dim), q_enc, q_mask, d_enc, d_mask, a_mask)

    def select(self, keep: torch.Tensor) -> "Running":
        """Only the rows where ``keep`` (inference: no gradient flows through the copies)."""
        return Running(self.rows[keep], self.alive[keep], self.spent[keep], self.s[keep], self.q_enc[keep],
                       self.q_mask[keep], self.d_enc.select(keep), self.d_mask[keep],
                       self.a_mask[keep])


class HaltingRecord:
    """Per-step results of the ACT loop, gathered back to the full batch of B examples; with
    ``keep``, also tensors of each step asked for (``add``'s ``kept``), e.g. for a trace."""

    def __init__(self, batch_size: int, keep: bool = False) -> None:
        self.batch_size, self.keep = batch_size, keep
        self.h: list[torch.Tensor] = []          # (B,) h_t per step
        self.p: list[torch.Tensor] = []          # (B,) p_t
        self.log_d: list[torch.Tensor] = []      # (B, Ld) log d_{i,t}
        self.kept: list[tuple[torch.Tensor | None, ...]] = []  # (B, ...) per step, 0 where not run
        self.steps: torch.Tensor | None = None   # (B,) int64 N
        self.remainder: torch.Tensor | None = None

    def _full(self, rows: torch.Tensor, x: torch.Tensor, fill: float) -> torch.Tensor:
        """(A, ...) values of ``rows`` -> (B, ...), ``fill`` for the examples no longer running."""
        if x.shape[0] == self.batch_size:
            return x
        return x.new_full((self.batch_size, *x.shape[1:]), fill).index_copy(0, rows, x)

    def add(self, rows: torch.Tensor, step: int, h: torch.Tensor, p: torch.Tensor, halts: torch.Tensor,
            log_d: torch.Tensor, kept: tuple[torch.Tensor | None, ...] = ()) -> None:
        """One step t = ``step`` + 1 of the running ``rows``: h_t, p_t, who halts, log d_{i,t}."""
        if self.keep:
            self.kept.append(tuple(None if x is None else self._full(rows, x, 0.0) for x in kept))
        if self.steps is None:
            self.steps = torch.zeros(self.batch_size, dtype=torch.long, device=p.device)
            self.remainder = p.new_zeros(self.batch_size)
        self.h.append(self._full(rows, h, 0.0))
        self.p.append(self._full(rows, p, 0.0))
        self.log_d.append(self._full(rows, log_d, float("-inf")))
        stopped = rows[halts]
        self.steps = self.steps.index_fill(0, stopped, step + 1)
        self.remainder = self.remainder.index_put((stopped,), p[halts])

    def finish(self) -> tuple[torch.Tensor, Halting]:
        """log Σ_t p_t d_{i,t} (B, Ld) and the ``Halting``."""
        p = torch.stack(self.p)                                                 # (n, B)
        log_att = mixture_log(safe_log(p), torch.stack(self.log_d))             # (B, Ld)
        return log_att, Halting(torch.stack(self.h, 1), p.t(), self.steps, self.remainder)
