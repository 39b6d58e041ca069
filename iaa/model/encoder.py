"""Bidirectional GRU encoder (paper section 3, "Bidirectional Encoding", eq. 1)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def rnn_dtype(device: str, precision: str) -> torch.dtype:
    """The dtype ``nn.GRU`` runs in on ``device`` (a device type) in ``precision`` (fp32 | bf16).

    Autocast's rule for ``_cudnn_rnn`` casts to fp16 whatever the autocast dtype, so under bf16
    autocast a GRU left to it would run in fp16, without a gradient scaler. Instead autocast is
    turned off around the GRU and its input and weights are cast to this dtype:

    - bf16 in precision bf16 where the device has bf16 RNN kernels (the CPU; CUDA with cuDNN
      9.13 or later);
    - fp32 otherwise. On CUDA, fp32 matmuls may use TF32 when ``torch.backends.cudnn.allow_tf32``
      is on (torch's default).
    """
    if precision != "bf16":
        return torch.float32
    if device == "cuda":
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return torch.bfloat16 if version is not None and version >= 91300 else torch.float32
    return torch.bfloat16


def arithmetic(device: str, precision: str):
    """Autocast on ``device`` as ``precision`` asks, whatever the caller's: bf16 autocast for
    bf16 (the parts that need fp32 ask for it), autocast off for fp32."""
    if not torch.amp.is_autocast_available(device):
        return nullcontext()
    return torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")


Encode = Callable[[torch.Tensor, torch.Tensor, nn.GRU], torch.Tensor]
"""A fast BiGRU over ``gru``'s parameters (the reader's encoder slot, ``iaa.model.kernels``):
(x (B, L, d), lengths (B,) beside x, gru) -> states (B, L, 2h), 0 at padding."""


def packed_gru(x: torch.Tensor, lengths: torch.Tensor, gru: nn.GRU, host_lengths: torch.Tensor | None = None,
               precision: str = "fp32") -> torch.Tensor:
    """The reference BiGRU: ``gru`` over the packed real tokens, in ``rnn_dtype`` with
    autocast off: (B, L, 2h).

    ``host_lengths`` (``lengths`` on the host) spares reading them back from the device (a sync
    on a GPU). The rows are sorted by length here, on the host: ``pack_padded_sequence`` with
    ``enforce_sorted=False`` would hand ``pad_packed_sequence`` device indices that it copies
    back to the host.
    """
    host = lengths.cpu() if host_lengths is None else host_lengths
    dtype = rnn_dtype(x.device.type, precision)
    by_length, order = torch.sort(host, descending=True)                 # host
    order_dev = order.to(x.device, non_blocking=True)
    restore = torch.argsort(order).to(x.device, non_blocking=True)
    with arithmetic(x.device.type, "fp32"):                                # autocast off
        packed = pack_padded_sequence(x.index_select(0, order_dev).to(dtype), by_length, batch_first=True)
        if dtype == torch.float32:
            out = gru(packed)[0]
        else:                                                              # the weights in dtype too
            weights = {name: p.to(dtype) for name, p in gru.named_parameters()}
            out = torch.func.functional_call(gru, weights, (packed,))[0]
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return states.index_select(0, restore)                                 # (B, L, 2h), batch order


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

    Masks must be left-aligned: row b is real at positions [0, length_b), length_b >= 1.
    """

    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gru = nn.GRU(input_dim, hidden_dim, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor | None = None,
                precision: str = "fp32", encode: Encode | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, L, d), mask: (B, L) bool, lengths: (B,) int64 on the CPU, ``mask.sum(1)``
        (optional: without them the ``nn.GRU`` path reads the mask's sums back from the device,
        a host sync on CUDA). ``encode``: the reader's encoder slot (``iaa.model.kernels``), a
        fast BiGRU over the same parameters; None: ``packed_gru`` in ``precision``.

        Returns:
            states: (B, L, 2h), exactly 0 at padded positions.
            final: (B, 2h), [forward state at the last real token, backward state at position 0].
        """
        on_device = mask.sum(1)                                            # (B,) beside x
        if encode is not None:
            states = encode(x, on_device, self.gru)                        # (B, L, 2h)
        else:
            states = packed_gru(x, on_device, self.gru, lengths, precision)
        return states, self.final(states, on_device)

    def final(self, states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[→h at the last real token, ←h at position 0]: (B, 2h)."""
        h = self.gru.hidden_size
        last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, h)
        return torch.cat([states[..., :h].gather(1, last).squeeze(1), states[:, 0, h:]], -1)
