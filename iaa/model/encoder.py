"""Bidirectional GRU encoder (paper section 3, "Bidirectional Encoding", eq. 1)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from iaa.model.fused_gru import bigru_from_table, fused_bigru, input_table


def rnn_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.GRU`` runs in, chosen here rather than by autocast.

    Autocast's rule for ``_cudnn_rnn`` casts to fp16 whatever the autocast dtype, so under bf16
    autocast a GRU left to it would run in fp16, without a gradient scaler. Instead autocast is
    turned off around the GRU and its input and weights are cast to this dtype:

    - bf16 when bf16 autocast is on for ``x``'s device and that device has bf16 RNN kernels (the
      CPU; CUDA with cuDNN 9.13 or later);
    - fp32 otherwise: no autocast, fp16 autocast (never fp16 here), or an older cuDNN. On CUDA,
      fp32 matmuls may use TF32 when ``torch.backends.cudnn.allow_tf32`` is on (torch's default).
    """
    device = x.device.type
    if not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
            and torch.get_autocast_dtype(device) == torch.bfloat16):
        return torch.float32
    if device == "cuda":
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return torch.bfloat16 if version is not None and version >= 91300 else torch.float32
    return torch.bfloat16


def _autocast_off(device: str):
    """Autocast off for ``device`` (where autocast exists for it)."""
    return torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else nullcontext()


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, L, d), mask: (B, L) bool, lengths: (B,) int64 on the CPU, ``mask.sum(1)``
        (optional: without them the ``nn.GRU`` path reads the mask's sums back from the device,
        a host sync on CUDA).

        Returns:
            states: (B, L, 2h), exactly 0 at padded positions.
            final: (B, 2h), [forward state at the last real token, backward state at position 0].
        """
        on_device = mask.sum(1)                                            # (B,) beside x
        if self.fused and x.is_cpu:
            states = fused_bigru(x, on_device, self.gru._flat_weights)    # (B, L, 2h)
        else:
            host = on_device.cpu() if lengths is None else lengths
            states = self._packed_gru(x, host)                            # (B, L, 2h)
        return states, self._final(states, on_device)

    def _packed_gru(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``nn.GRU`` over the packed real tokens, in ``rnn_dtype(x)`` with autocast off: (B, L, 2h).

        The rows are sorted by length here, on the host: ``pack_padded_sequence`` with
        ``enforce_sorted=False`` would hand ``pad_packed_sequence`` device indices that it copies
        back to the host (a sync on a GPU).
        """
        dtype = rnn_dtype(x)
        by_length, order = torch.sort(lengths, descending=True)           # host
        order_dev = order.to(x.device, non_blocking=True)
        restore = torch.argsort(order).to(x.device, non_blocking=True)
        with _autocast_off(x.device.type):
            packed = pack_padded_sequence(x.index_select(0, order_dev).to(dtype), by_length, batch_first=True)
            if dtype == torch.float32:
                out = self.gru(packed)[0]
            else:                                                          # the weights in dtype too
                weights = {name: p.to(dtype) for name, p in self.gru.named_parameters()}
                out = torch.func.functional_call(self.gru, weights, (packed,))[0]
            states, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return states.index_select(0, restore)                             # (B, L, 2h), batch order

    @torch.no_grad()
    def forward_from_table(self, tokens: torch.Tensor, mask: torch.Tensor,
                           table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward(embedding[tokens], mask)`` without input dropout or gradient, from the
        per-word input projections ``table = self.input_table(embedding)`` (fused CPU path)."""
        lengths = mask.sum(1)
        states = bigru_from_table(tokens, lengths, table, self.gru._flat_weights)
        return states, self._final(states, lengths)

    @torch.no_grad()
    def input_table(self, embedding: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Every word's input projection for both directions: (2, V, 3h), in ``dtype``."""
        return input_table(embedding, self.gru._flat_weights, dtype)

    def _final(self, states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.gru.hidden_size
        last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, h)
        return torch.cat([states[..., :h].gather(1, last).squeeze(1), states[:, 0, h:]], -1)
