"""Attentive reads over query and document encodings (paper section 3, "Iterative Alternating
Attention"), and the AS Reader's dot-product read.

The reads apply their projections through ``layers`` (``Layers`` here: the layers themselves;
under bf16 on the CPU a kernel's, ``iaa.model.kernels``), and read the document through an
``Encodings`` (or a kernel's object with the same three methods).
"""

from __future__ import annotations

import torch
from torch import nn

from iaa.model.masking import masked_softmax


def glimpse(weights: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """Σ_i w_i m_i. weights: (B, L), memory: (B, L, k) -> (B, k)."""
    return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)


def bilinear_logits(memory: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """m_iᵀ key. memory: (B, L, k), key: (B, k) -> (B, L)."""
    return torch.bmm(memory, key.unsqueeze(2)).squeeze(2)


class Encodings:
    """Encodings M (B, L, k) that the steps read, under autograd."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def logits(self, key: torch.Tensor) -> torch.Tensor:
        """m_iᵀ key: (B, L)."""
        return bilinear_logits(self.tensor, key)

    def glimpse(self, weights: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i m_i: (B, k)."""
        return glimpse(weights, self.tensor)

    def select(self, rows: torch.Tensor) -> "Encodings":
        """The encodings of the examples ``rows`` only."""
        return Encodings(self.tensor[rows])


class Layers:
    """How the steps apply their layers: each layer itself."""

    @staticmethod
    def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        return layer(x)

    @staticmethod
    def gru_cell(x: torch.Tensor, h: torch.Tensor, cell: nn.GRUCell) -> torch.Tensor:
        return cell(x, h)


class QueryRead(nn.Module):
    """q_{i,t} = softmax_i q̃_iᵀ(A_q s_{t-1} + a_q);  q_t = Σ_i q_{i,t} q̃_i.

    Args:
        state_dim: s. enc_dim: 2h.
    """

    def __init__(self, state_dim: int, enc_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(state_dim, enc_dim)                 # A_q (2h x s), a_q

    def forward(self, s: torch.Tensor, q_enc: torch.Tensor, q_mask: torch.Tensor, layers=Layers):
        """s: (B, s), q_enc: (B, Lq, 2h), q_mask: (B, Lq). Returns q_t (B, 2h), q_att (B, Lq)."""
        att = masked_softmax(bilinear_logits(q_enc, layers.linear(s, self.proj)), q_mask)  # (B, Lq)
        return glimpse(att, q_enc), att


class FixedQueryRead(nn.Module):
    """The ablation "fixed query attention": q_{i,t} = 1/|Q| over real query tokens."""

    def forward(self, s: torch.Tensor, q_enc: torch.Tensor, q_mask: torch.Tensor, layers=Layers):
        """Same contract as ``QueryRead``; ``s`` is ignored."""
        att = q_mask.to(q_enc.dtype) / q_mask.sum(1, keepdim=True)          # (B, Lq)
        return glimpse(att, q_enc), att


class DocRead(nn.Module):
    """d_{i,t} = softmax_i d̃_iᵀ(A_d [s_{t-1}, q_t] + a_d);  d_t = Σ_i d_{i,t} d̃_i.

    Args:
        state_dim: s. enc_dim: 2h.
    """

    def __init__(self, state_dim: int, enc_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(state_dim + enc_dim, enc_dim)       # A_d (2h x (s + 2h)), a_d

    def logits(self, s: torch.Tensor, q_t: torch.Tensor, d_enc: Encodings, layers=Layers) -> torch.Tensor:
        """Unnormalised scores d̃_iᵀ(A_d [s, q_t] + a_d): (B, Ld)."""
        return d_enc.logits(layers.linear(torch.cat([s, q_t], -1), self.proj))

    def forward(self, s: torch.Tensor, q_t: torch.Tensor, d_enc: Encodings, d_mask: torch.Tensor, layers=Layers):
        """s: (B, s), q_t: (B, 2h), d_enc: d̃ (B, Ld, 2h). Returns d_t (B, 2h), d_att (B, Ld), logits (B, Ld)."""
        logits = self.logits(s, q_t, d_enc, layers)                          # (B, Ld)
        att = masked_softmax(logits, d_mask)                                 # d_{i,t}
        return d_enc.glimpse(att), att, logits
