"""Which dtype a matmul computes in: autocast's, when it is on.

``train.precision=bf16`` runs the reader under ``torch.autocast(device, torch.bfloat16)``. On the
CPU, the fused encoder and the inference table (``fused_gru``) and the attention reads
(``attention.Memory``) then give their large matmuls bf16 operands explicitly; the recurrent
``h W_hh`` matmuls take bf16 operands on AMX only (``gru_kernels``). The gate arithmetic, the
softmaxes and the pointer-sum stay fp32, and parameters never change dtype.

The T steps' small matmuls (32 rows at batch 32: gates, inference GRU, read projections) run
under ``small_matmuls``: fp32 in training (autocast's per-call weight casts cost more than bf16
saves there), and in bf16 inference with bf16 copies of the weights made once per
``small_matmuls`` block, i.e. once per forward pass, and shared by its T steps (``linear``,
``gru_cell``): each step re-reads the weights from memory, and bf16 halves those bytes. The
copies never outlive the block: an optimizer may change the weights in place without bumping
their version counter (fused Adam does not), so a cache across passes could serve stale ones.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

# False keeps the small matmuls fp32 in bf16 inference too (benchmarks time the two side by side).
BF16_SMALL_MATMULS = True
_SMALL = threading.local()


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype on ``device_type`` ("cpu", "cuda"), or None when autocast is off there
    (or does not exist for that device type)."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``tensor`` runs in here: autocast's, when it is on for its device
    (autocast casts floating-point tensors other than float64)."""
    dtype = autocast_dtype(tensor.device.type)
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != torch.float64:
        return dtype
    return tensor.dtype


def cpu_bf16() -> bool:
    """Whether CPU matmuls of the reader compute in bf16 here (CPU autocast with bfloat16)."""
    return autocast_dtype("cpu") == torch.bfloat16


@contextmanager
def small_matmuls(bf16: bool) -> Iterator[None]:
    """CPU autocast off for the T steps' small matmuls; ``bf16`` (inference, no gradient):
    ``linear`` and ``gru_cell`` multiply bf16 copies of their inputs and weights instead."""
    before = getattr(_SMALL, "bf16", False), getattr(_SMALL, "copies", {})
    _SMALL.bf16, _SMALL.copies = bf16 and BF16_SMALL_MATMULS, {}
    try:
        with torch.autocast("cpu", enabled=False):
            yield
    finally:
        _SMALL.bf16, _SMALL.copies = before


def _bf16(param: torch.Tensor) -> torch.Tensor:
    """A bf16 copy of ``param``, made once per ``small_matmuls`` block."""
    copy = _SMALL.copies.get(id(param))
    if copy is None:
        copy = _SMALL.copies[id(param)] = param.detach().to(torch.bfloat16)
    return copy


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)``; under ``small_matmuls(bf16=True)`` with bf16 operands, the result in fp32."""
    if not getattr(_SMALL, "bf16", False):
        return layer(x)
    bias = _bf16(layer.bias) if layer.bias is not None else None
    return F.linear(x.to(torch.bfloat16), _bf16(layer.weight), bias).float()


def gru_cell(x: torch.Tensor, h: torch.Tensor, cell: nn.GRUCell) -> torch.Tensor:
    """``cell(x, h)``; under ``small_matmuls(bf16=True)`` its two matmuls take bf16 operands and
    the gates (PyTorch's order r, z, n) and the new state are computed in fp32."""
    if not getattr(_SMALL, "bf16", False):
        return cell(x, h)
    gi = F.linear(x.to(torch.bfloat16), _bf16(cell.weight_ih), _bf16(cell.bias_ih)).float()  # (B, 3s)
    gh = F.linear(h.to(torch.bfloat16), _bf16(cell.weight_hh), _bf16(cell.bias_hh)).float()
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return torch.lerp(n, h, z)                                          # n + z (h - n)
