"""The encoders' BiGRU as one persistent Triton kernel per pass: both directions in one launch.

The fallback for CUDA where cuDNN's persistent GRU (``padded_gru``) is too slow per time step or
overlaps too little on streams (``benchmarks/device_gpu.py``, step ``gate``). Off by default
(``model.triton_gru``); needs Triton (``pip install -e '.[triton]'``).

The input projection of every position and both directions is one GEMM in PyTorch,
``gi = x W_ih^T + b_ih`` (B, L, 2, 3h), differentiated by autograd. The recurrence (eq. 1, with
PyTorch's GRU gates) is the kernel: one program per block of 16 rows and per direction walks the
time steps, its state in registers,

    r = σ(gi_r + W_hr h + b_hr),  z = σ(gi_z + W_hz h + b_hz),  n = tanh(gi_n + r ⊙ (W_hn h + b_hn)),
    h' = (1 - z) ⊙ n + z ⊙ h,

reading ``W_hh`` from L2 at each step (3h x h: too large for one program's registers at h = 128).
The products W_hg h take 32 columns of W at a time, against the previous state read back from the
output the step before wrote (a barrier between): a program then holds a (32, h) tile of W, not
three (h, h) ones (at h = 128 with 8 warps, sm_90: 24 bytes of stack per thread forward, none
backward, against 8 and 11 KB for whole tiles). The backward direction reads each row reversed
within its own length (position ``len - 1 - t`` at step t), so neither direction computes or
reads padding, and there are no gathers; padded positions of the output stay exactly 0. Rows of
a block that are shorter stop updating.

The backward pass is a second kernel that walks the steps in reverse with the gradient of the
state in registers, from the gates the forward pass kept (r, z, n and W_hn h + b_hn: (B, L, 2, 4h));
it writes the gradients of the gates' pre-activations (read back, 32 columns at a time, for the
products with W_hh), and the weights' gradients are GEMMs over them in PyTorch
(``dW_hh = Σ dgh^T h_prev``; ``dgi`` goes back through the projection by autograd).

Exact: each product is an IEEE product (``input_precision="ieee"``, no TF32), so the result equals
``nn.GRU(bidirectional=True)`` over packed rows up to the order of float sums (fp64 on the CPU
through Triton's interpreter, ``TRITON_INTERPRET=1``: ``tests/test_triton_gru.py``). It runs in
the weights' dtype (fp32 on CUDA in either precision, as ``padded_gru``). No host sync: lengths
stay on the device, so a CUDA graph may capture it (after one eager call, which compiles it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from iaa.model.kernels.support import Support

MAX_HIDDEN = 256       # a program's state and gate tiles are (16, next power of 2 of h)
BLOCK_ROWS = 16        # rows per program: the smallest tile Triton's dot takes on a GPU
_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def triton_missing() -> str | None:
    """Why Triton cannot run here (None: it can)."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return f"Triton is not installed ({err}); pip install -e '.[triton]'"
    return None


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The forward and backward recurrences (``triton_recurrence``), imported at first use."""
    from iaa.model.kernels import triton_recurrence

    return triton_recurrence.forward, triton_recurrence.backward


def _sizes(h: int) -> dict[str, int]:
    """The launch's compile-time sizes for hidden size h: the tiles' width ``hp`` (a power of 2,
    at least 16), the columns of W read per product (``chunk``), the rows per program, and the
    warps (8 from hp = 128 on: see the module docstring for what that keeps in registers)."""
    hp = max(16, 1 << (h - 1).bit_length())
    return {"h": h, "hp": hp, "chunk": min(32, hp), "rows_per": BLOCK_ROWS, "num_warps": 8 if hp >= 128 else 4}


class _Recurrence(torch.autograd.Function):
    """gi (B, L, 2, 3h), w_hh (2, 3h, h), b_hh (2, 3h), lengths (B,) -> states (B, L, 2, h)."""

    @staticmethod
    def forward(ctx, gi, w_hh, b_hh, lengths):
        batch, length, _, three_h = gi.shape
        sizes = _sizes(three_h // 3)
        out = gi.new_zeros(batch, length, 2, sizes["h"])
        save = any(ctx.needs_input_grad[:3])
        gates = gi.new_empty(batch, length, 2, 4 * sizes["h"]) if save else out
        kernel, _ = _kernels()
        kernel[_grid(batch)](gi, w_hh, b_hh, lengths, out, gates, batch, length, save=save, **sizes)
        if save:
            ctx.save_for_backward(gates, out, w_hh, lengths)
        return out

    @staticmethod
    def backward(ctx, d_out):
        gates, out, w_hh, lengths = ctx.saved_tensors
        batch, length, _, h = out.shape
        d_gi = out.new_zeros(batch, length, 2, 3 * h)
        d_gh = out.new_zeros(batch, length, 2, 3 * h)
        _, kernel = _kernels()
        kernel[_grid(batch)](d_out.contiguous(), gates, out, w_hh, lengths, d_gi, d_gh, batch, length, **_sizes(h))
        # the state before each step, per direction: forward one position earlier, backward one
        # later (0 past the row's end, where the output is 0)
        before = torch.stack([nn.functional.pad(out[:, :-1, 0], (0, 0, 1, 0)),
                              nn.functional.pad(out[:, 1:, 1], (0, 0, 0, 1))], 0)     # (2, B, L, h)
        per_direction = d_gh.permute(2, 0, 1, 3).reshape(2, batch * length, 3 * h)     # (2, BL, 3h)
        d_w_hh = torch.bmm(per_direction.transpose(1, 2), before.reshape(2, batch * length, h))
        return d_gi, d_w_hh, per_direction.sum(1), None


def _grid(batch: int) -> tuple[int, int]:
    """One program per block of rows and per direction."""
    return -(-batch // BLOCK_ROWS), 2


class TritonGRU:
    """The encoders' BiGRU on CUDA as one persistent Triton kernel per pass (h <= 256).

    See the module docstring. Chosen over ``PaddedGRU`` where ``model.triton_gru`` is on and
    Triton imports. The GRU runs in the weights' dtype (fp32) in either precision.
    """

    slot, switch = "encoder", "triton_gru"
    capturable = True     # no host sync: a CUDA graph may capture it (after one eager call)
    support = Support(devices=frozenset({"cuda"}))

    @classmethod
    def make(cls, cfg, precision: str) -> "TritonGRU | None":
        """The kernel for ``cfg`` (touches no device; the same in either precision), or None where
        it cannot run here."""
        return cls() if cls.why_not(cfg) is None else None

    @staticmethod
    def why_not(cfg) -> str | None:
        """Why the kernel does not run ``cfg``'s encoders (None: it does)."""
        if cfg.hidden_dim > MAX_HIDDEN:
            return f"TritonGRU covers h <= {MAX_HIDDEN}"
        return triton_missing()

    def amx_recurrence(self, h: int) -> bool:
        """Whether the recurrent matmuls multiply on the CPU's AMX units: never."""
        return False

    def encode(self, x: torch.Tensor, lengths: torch.Tensor, gru: nn.GRU) -> torch.Tensor:
        """x: (B, L, d), lengths: (B,) int64 on x's device -> states (B, L, 2h), 0 at padding."""
        batch, length, _ = x.shape
        h = gru.hidden_size
        dtype = gru.weight_ih_l0.dtype
        with torch.autocast(x.device.type, enabled=False):
            w_ih, w_hh, b_ih, b_hh = (torch.cat([getattr(gru, f"{name}_l0{s}") for s in ("", "_reverse")])
                                      for name in _NAMES)
            gi = torch.addmm(b_ih, x.reshape(batch * length, -1).to(dtype), w_ih.t())      # (BL, 6h)
            states = _Recurrence.apply(gi.view(batch, length, 2, 3 * h), w_hh.view(2, 3 * h, h),
                                       b_hh.view(2, 3 * h), lengths.contiguous())
        return states.view(batch, length, 2 * h)
