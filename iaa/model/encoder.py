"""Bidirectional GRU encoder (paper section 3, "Bidirectional Encoding", eq. 1)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from iaa.model.fused_gru import bigru_from_table, fused_bigru, input_table


def _rnn_precision(x: torch.Tensor):
    """Autocast as it is, except a bf16 GRU on cuDNN before 9.13, which has no bf16 RNN kernels:
    that GRU runs in fp32 (autocast off around it)."""
    if x.is_cuda and torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16:
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if version is None or version < 91300:
            return torch.autocast("cuda", enabled=False)
    return nullcontext()


class BiGRUEncoder(nn.Module):
    """x̃_i = [→h_i, ←h_i] ∈ R^{2h} for each real token; padding never changes the result.

    The GRU is PyTorch's (and cuDNN's): the reset gate multiplies the recurrent term after its
    matrix, n = tanh(W_in x + b_in + r ∘ (W_hn h + b_hn)), where the paper's eq. 1 has
    tanh(I_h x + H_h (r ∘ h)). Same gates and state update otherwise. We keep PyTorch's form
    because it is the one cuDNN runs (the GPU path) and lets one matmul per step serve all three
    gates (the CPU path); the inference GRU (``nn.GRUCell``) uses it too.

    Args:
        input_dim: d, the embedding size.
        hidden_dim: h, per direction.
        fused: on CPU, use the packed, hand-differentiated recurrence of ``fused_gru`` (fast
            path); otherwise ``nn.GRU`` over ``pack_padded_sequence`` (reference path, and on
            CUDA cuDNN's packed GRU, the fast path there). Both read the same ``nn.GRU``
            parameters and compute the same function.

    Masks must be left-aligned: row b is real at positions [0, length_b), length_b >= 1.
    """

    def __init__(self, input_dim: int, hidden_dim: int, fused: bool = True) -> None:
        super().__init__()
        self.gru = nn.GRU(input_dim, hidden_dim, batch_first=True, bidirectional=True)
        self.fused = fused

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, L, d), mask: (B, L) bool.

        Returns:
            states: (B, L, 2h), exactly 0 at padded positions.
            final: (B, 2h), [forward state at the last real token, backward state at position 0].
        """
        lengths = mask.sum(1)                                              # (B,)
        if self.fused and x.is_cpu:
            states = fused_bigru(x, lengths, self.gru._flat_weights)       # (B, L, 2h)
        else:
            with _rnn_precision(x):
                packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
                states, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True,
                                                total_length=x.shape[1])   # (B, L, 2h)
        return states, self._final(states, lengths)

    @torch.no_grad()
    def forward_from_table(self, tokens: torch.Tensor, mask: torch.Tensor,
                           table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward(embedding[tokens], mask)`` without input dropout or gradient, from the
        per-word input projections ``table = self.input_table(embedding)`` (fused CPU path)."""
        lengths = mask.sum(1)
        states = bigru_from_table(tokens, lengths, table, self.gru._flat_weights)
        return states, self._final(states, lengths)

    @torch.no_grad()
    def input_table(self, embedding: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Every word's input projection for both directions: (V, 2, 3h), in ``dtype``."""
        return input_table(embedding, self.gru._flat_weights, dtype)

    def _final(self, states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.gru.hidden_size
        last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, h)
        return torch.cat([states[..., :h].gather(1, last).squeeze(1), states[:, 0, h:]], -1)
