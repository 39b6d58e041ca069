"""Which dtype a matmul computes in: autocast's, when it is on.

``train.precision=bf16`` runs the reader under ``torch.autocast(device, torch.bfloat16)``. On the
CPU, the fused encoder and the inference table (``fused_gru``) and the attention reads
(``attention.Memory``) then give their large matmuls bf16 operands explicitly; the recurrent
``h W_hh`` matmuls take bf16 operands on AMX only (``gru_kernels``). The gate arithmetic, the
softmaxes and the pointer-sum stay fp32, and parameters never change dtype.

The T steps' small matmuls (32 rows at batch 32: gates, inference GRU, read projections) run
under ``small_matmuls``, which hands ``linear`` and ``gru_cell`` weights prepared once per block,
i.e. once per forward pass, and shared by its T steps:

- training under bf16 where the CPU has AMX (``amx=True``): bf16 operands on AMX
  (``gru_kernels.amx_linear``, fp32 sums), the weights packed for the forward product (W^T) and
  for the input gradient (W); each weight's gradient Σ_t dy_tᵀx_t is one AMX product over the
  T steps, the bias gradient an fp32 sum. oneDNN's bf16 kernels cost more than they save at
  32 rows (they repack the weight on every call), and so does autocast's per-call cast;
- bf16 inference (``bf16=True``): bf16 copies of the weights (oneDNN): each step re-reads the
  weights from memory, and bf16 halves those bytes (CPUs without AVX-512; elsewhere the C++
  steps of ``inference_steps`` serve inference);
- otherwise fp32.

The prepared weights never outlive the block: an optimizer may change the weights in place
without bumping their version counter (fused Adam does not), so a cache across passes could
serve stale ones.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from iaa.model import gru_kernels
from iaa.model.deferred import DeferredGrad

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


def amx_usable() -> bool:
    """Whether ``small_matmuls(amx=True)`` multiplies on AMX here (CPU, kernels built, AMX granted)."""
    kernels = gru_kernels.load()
    return kernels is not None and kernels.amx_paths(32)


@contextmanager
def small_matmuls(bf16: bool, amx: bool = False) -> Iterator[None]:
    """CPU autocast off for the T steps' small matmuls. ``bf16`` (inference, no gradient):
    ``linear`` and ``gru_cell`` multiply bf16 copies of their inputs and weights instead;
    ``amx`` (training): they multiply bf16 operands on AMX where the CPU has it."""
    before = getattr(_SMALL, "bf16", False), getattr(_SMALL, "amx", False), getattr(_SMALL, "copies", {})
    _SMALL.bf16 = bf16 and BF16_SMALL_MATMULS
    _SMALL.amx = amx and BF16_SMALL_MATMULS and amx_usable()
    _SMALL.copies = {}
    try:
        with torch.autocast("cpu", enabled=False):
            yield
    finally:
        _SMALL.bf16, _SMALL.amx, _SMALL.copies = before


class _WeightGrad:
    """The factors (dy, x) of each product x Wᵀ with one weight W in a block: W's gradient is
    Σ_t dy_tᵀ x_t over the block's T products, one AMX product (inner size T x batch) instead of
    T products and T - 1 additions of a weight-sized gradient (``deferred.DeferredGrad``)."""

    def __init__(self) -> None:
        self.dys: list[torch.Tensor] = []
        self.xs: list[torch.Tensor] = []

    def gradient(self) -> torch.Tensor | None:
        if not self.dys:
            return None
        dy, x = torch.cat(self.dys), torch.cat(self.xs)                       # (R, N), (R, K)
        self.dys, self.xs = [], []
        pad = -dy.shape[0] % 32                                               # AMX: inner size % 32
        if pad:
            dy, x = F.pad(dy, (0, 0, 0, pad)), F.pad(x, (0, 0, 0, pad))
        return gru_kernels.load().amx_matmul(dy.t().contiguous(), x)          # (N, K) fp32


class _AmxLinear(torch.autograd.Function):
    """y = x Wᵀ + b with bf16 operands on AMX. Backward: dx = dy W on AMX, db = Σ dy in fp32, and
    (dy, x) handed to the weight's ``_WeightGrad``."""

    @staticmethod
    def forward(ctx, x, weight, bias, packed_t, packed, grads):
        ctx.save_for_backward(x)
        ctx.packed, ctx.has_bias, ctx.grads = packed, bias is not None, grads
        return gru_kernels.load().amx_linear(x, packed_t, bias if bias is not None else x.new_empty(0))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = gru_kernels.load().amx_linear(dy, ctx.packed, dy.new_empty(0)) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            ctx.grads.dys.append(dy)
            ctx.grads.xs.append(x)
        return dx, None, dy.sum(0) if ctx.has_bias else None, None, None, None


def _amx_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` on AMX under ``small_matmuls(amx=True)``, with the weight
    packed once per block; None where AMX does not run (off, or a size not a multiple of 32)."""
    n_out, n_in = weight.shape
    if not getattr(_SMALL, "amx", False) or n_out % 32 or n_in % 32:
        return None
    prepared = _SMALL.copies.get(id(weight))
    if prepared is None:
        kernels, grads = gru_kernels.load(), _WeightGrad()
        node = DeferredGrad.apply(weight, grads) if weight.requires_grad else weight
        prepared = _SMALL.copies[id(weight)] = (node, kernels.pack_linear(weight, True),
                                                kernels.pack_linear(weight, False), grads)
    node, packed_t, packed, grads = prepared
    return _AmxLinear.apply(x, node, bias, packed_t, packed, grads)


def _bf16(param: torch.Tensor) -> torch.Tensor:
    """A bf16 copy of ``param``, made once per ``small_matmuls`` block."""
    copy = _SMALL.copies.get(id(param))
    if copy is None:
        copy = _SMALL.copies[id(param)] = param.detach().to(torch.bfloat16)
    return copy


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)``; under ``small_matmuls(bf16=True)`` or ``(amx=True)`` with bf16 operands,
    the result in fp32."""
    y = _amx_linear(x, layer.weight, layer.bias)
    if y is not None:
        return y
    if not getattr(_SMALL, "bf16", False):
        return layer(x)
    bias = _bf16(layer.bias) if layer.bias is not None else None
    return F.linear(x.to(torch.bfloat16), _bf16(layer.weight), bias).float()


def gru_cell(x: torch.Tensor, h: torch.Tensor, cell: nn.GRUCell) -> torch.Tensor:
    """``cell(x, h)``; under ``small_matmuls(bf16=True)`` or ``(amx=True)`` its two matmuls take
    bf16 operands and the gates (PyTorch's order r, z, n) and the new state are computed in fp32."""
    gi = _amx_linear(x, cell.weight_ih, cell.bias_ih)
    gh = _amx_linear(h, cell.weight_hh, cell.bias_hh) if gi is not None else None
    if gh is None:
        if not getattr(_SMALL, "bf16", False):
            return cell(x, h)
        gi = F.linear(x.to(torch.bfloat16), _bf16(cell.weight_ih), _bf16(cell.bias_ih)).float()  # (B, 3s)
        gh = F.linear(h.to(torch.bfloat16), _bf16(cell.weight_hh), _bf16(cell.bias_hh)).float()
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return torch.lerp(n, h, z)                                          # n + z (h - n)
