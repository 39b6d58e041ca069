"""The attention steps' small matmuls in bf16 (CPU): 32 rows at batch 32 (gates, inference GRU,
read projections), where oneDNN's bf16 kernels and autocast's per-call casts cost more than
bf16 saves.

Under precision bf16 the steps run with CPU autocast off, and ``SmallMatmuls.block`` hands them
a ``Layers`` object whose ``linear`` and ``gru_cell`` multiply with weights prepared once per
block, i.e. once per forward pass, and shared by its T steps:

- training where the CPU has AMX: bf16 operands on AMX (``gru_kernels.amx_linear``, fp32
  sums), the weights packed for the forward product (W^T) and for the input gradient (W); each
  weight's gradient Σ_t dy_tᵀx_t is one AMX product over the T steps, the bias gradient an fp32
  sum. Without AMX, training multiplies in fp32;
- inference: bf16 copies of the weights (oneDNN): each step re-reads the weights from memory,
  and bf16 halves those bytes (CPUs without AVX-512; elsewhere ``inference_steps`` serves
  inference).

The gate arithmetic, the softmaxes and the state stay fp32, and parameters never change dtype.
The prepared weights never outlive the block: an optimizer may change the weights in place
without bumping their version counter (fused Adam does not), so a cache across passes could
serve stale ones.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from iaa.model.kernels import gru_kernels
from iaa.model.kernels.deferred import DeferredGrad
from iaa.model.kernels.support import Support


def amx_usable(cpp: ModuleType | None) -> bool:
    """Whether the built kernels ``cpp`` multiply on AMX here (kernels built, AMX granted)."""
    return cpp is not None and cpp.amx_paths(32)


class _WeightGrad:
    """The factors (dy, x) of each product x Wᵀ with one weight W in a block: W's gradient is
    Σ_t dy_tᵀ x_t over the block's T products, one AMX product (inner size T x batch) instead of
    T products and T - 1 additions of a weight-sized gradient (``deferred.DeferredGrad``)."""

    def __init__(self, cpp: ModuleType) -> None:
        self.cpp = cpp
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
        return self.cpp.amx_matmul(dy.t().contiguous(), x)                    # (N, K) fp32


class _AmxLinear(torch.autograd.Function):
    """y = x Wᵀ + b with bf16 operands on AMX. Backward: dx = dy W on AMX, db = Σ dy in fp32, and
    (dy, x) handed to the weight's ``_WeightGrad``."""

    @staticmethod
    def forward(ctx, x, weight, bias, packed_t, packed, grads):
        ctx.save_for_backward(x)
        ctx.packed, ctx.has_bias, ctx.grads = packed, bias is not None, grads
        return grads.cpp.amx_linear(x, packed_t, bias if bias is not None else x.new_empty(0))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = ctx.grads.cpp.amx_linear(dy, ctx.packed, dy.new_empty(0)) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            ctx.grads.dys.append(dy)
            ctx.grads.xs.append(x)
        return dx, None, dy.sum(0) if ctx.has_bias else None, None, None, None


class Layers:
    """``linear`` and ``gru_cell`` for one block (one forward pass): on AMX (``cpp``), with bf16
    copies of the weights (``bf16_copies``), or as the fp32 layers themselves."""

    def __init__(self, cpp: ModuleType | None = None, bf16_copies: bool = False) -> None:
        self.cpp, self.bf16_copies = cpp, bf16_copies
        self.prepared: dict[int, object] = {}                                 # by id of the weight

    def _amx_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """``F.linear(x, weight, bias)`` on AMX, with the weight packed once per block; None
        where AMX does not run (off, or a size not a multiple of 32)."""
        n_out, n_in = weight.shape
        if self.cpp is None or n_out % 32 or n_in % 32:
            return None
        prepared = self.prepared.get(id(weight))
        if prepared is None:
            grads = _WeightGrad(self.cpp)
            node = DeferredGrad.apply(weight, grads) if weight.requires_grad else weight
            prepared = self.prepared[id(weight)] = (node, self.cpp.pack_linear(weight, True),
                                                    self.cpp.pack_linear(weight, False), grads)
        node, packed_t, packed, grads = prepared
        return _AmxLinear.apply(x, node, bias, packed_t, packed, grads)

    def _bf16(self, param: torch.Tensor) -> torch.Tensor:
        """A bf16 copy of ``param``, made once per block."""
        copy = self.prepared.get(id(param))
        if copy is None:
            copy = self.prepared[id(param)] = param.detach().to(torch.bfloat16)
        return copy

    def linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        """``layer(x)``, the result in fp32."""
        y = self._amx_linear(x, layer.weight, layer.bias)
        if y is not None:
            return y
        if not self.bf16_copies:
            return layer(x)
        bias = self._bf16(layer.bias) if layer.bias is not None else None
        return F.linear(x.to(torch.bfloat16), self._bf16(layer.weight), bias).float()

    def gru_cell(self, x: torch.Tensor, h: torch.Tensor, cell: nn.GRUCell) -> torch.Tensor:
        """``cell(x, h)``: its two matmuls as ``linear``'s, the gates (PyTorch's order r, z, n)
        and the new state in fp32."""
        gi = self._amx_linear(x, cell.weight_ih, cell.bias_ih)
        gh = self._amx_linear(h, cell.weight_hh, cell.bias_hh) if gi is not None else None
        if gh is None:
            if not self.bf16_copies:
                return cell(x, h)
            gi = F.linear(x.to(torch.bfloat16), self._bf16(cell.weight_ih), self._bf16(cell.bias_ih)).float()  # (B, 3s)
            gh = F.linear(h.to(torch.bfloat16), self._bf16(cell.weight_hh), self._bf16(cell.bias_hh)).float()
        i_r, i_z, i_n = gi.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return torch.lerp(n, h, z)                                          # n + z (h - n)


class SmallMatmuls:
    """The attention steps' layers under precision bf16 on the CPU (see the module docstring).

    ``bf16_products=False`` keeps their products fp32 (with autocast off all the same): the
    benchmarks time the two side by side.
    """

    slot, switch = "layers", None
    support = Support(devices=frozenset({"cpu"}), precisions=frozenset({"bf16"}))

    def __init__(self, cpp: ModuleType | None = None, bf16_products: bool = True) -> None:
        self.cpp, self.bf16_products = cpp, bf16_products

    @classmethod
    def make(cls, cfg, precision: str) -> "SmallMatmuls":
        return cls(gru_kernels.load())

    def on_amx(self, grad: bool) -> bool:
        """Whether a block multiplies on AMX (``grad``: with gradients, i.e. in training)."""
        return grad and self.bf16_products and amx_usable(self.cpp)

    @contextmanager
    def block(self, grad: bool) -> Iterator[Layers]:
        """The layers of one forward pass (``grad``: gradients flow), CPU autocast off."""
        layers = Layers(self.cpp if self.on_amx(grad) else None, self.bf16_products and not grad)
        with torch.autocast("cpu", enabled=False):
            yield layers
