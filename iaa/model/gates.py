"""Search gates r = g([s_{t-1}, q_t, d_t, q_t ∘ d_t]) (paper section 3, "Gating Search Results")."""

from __future__ import annotations

import torch
from torch import nn

from iaa.model.attention import Layers


class SearchGate(nn.Module):
    """A 2-layer feed-forward net R^{s+6h} -> R^{2h} with a sigmoid output.

    The paper does not name the hidden activation; we use tanh (bounded, like the rest of the
    model's recurrent state).

    Args:
        in_dim: s + 6h. hidden_dim: the gate's hidden size. out_dim: 2h.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim, out_dim)

    def forward(self, features: torch.Tensor, layers=Layers) -> torch.Tensor:
        """features: (B, s + 6h) -> gate values in (0, 1): (B, 2h)."""
        return torch.sigmoid(layers.linear(torch.tanh(layers.linear(features, self.hidden)), self.out))


def gate_features(s: torch.Tensor, q_t: torch.Tensor, d_t: torch.Tensor) -> torch.Tensor:
    """[s_{t-1}, q_t, d_t, q_t ∘ d_t]: (B, s + 6h)."""
    return torch.cat([s, q_t, d_t, q_t * d_t], -1)
