"""A bidirectional GRU over packed real tokens, with a hand-written backward (the fast path).

Same mathematics as ``nn.GRU(bidirectional=True)`` over ``pack_padded_sequence`` (eq. 1; PyTorch's
gate order r, z, n with h_i = (1 - z) * n + z * h_{i-1}, i.e. the paper's u = 1 - z). Why it is
faster on CPU:

- Only real tokens are computed: the sequences are sorted by length and laid out time-major
  ("packed"); step t works on the first ``batch_sizes[t]`` rows, so padding costs nothing.
- The backward direction reads each sequence reversed within its own length, so both directions
  use the same packed layout; in C++ each direction's loop is one task, and with two threads the
  two run side by side.
- The input projections of all steps, and in backward the weight gradients of all steps, are
  each one large GEMM per direction; only ``h @ W_hh`` and a few element-wise ops remain per step.
- Under CPU autocast with bf16 (``train.precision=bf16``) those large GEMMs get bf16 operands
  explicitly (oneDNN accumulates in fp32 and rounds the result to bf16; AMX and AVX512-BF16 run
  them several times faster than fp32). The small per-step ``h W_hh`` matmuls take bf16
  operands only on AMX, in the C++ loop's own tile kernel (oneDNN's bf16 kernel is slower than
  fp32 at 32 rows); the gate arithmetic and the state carried over hundreds of steps stay fp32
  (docs/speed.md, "bf16 on CPU").
- The backward is written by hand: no autograd graph of ~10 nodes per step and direction.
- The per-step loops run in C++ (``gru_kernels``) when it builds; the Python loops below are the
  fallback and the second reference in the tests (``cpp=None``).
- Inference can start from a per-word table of input projections (``encoder_table``): one
  lookup per token instead of a matmul; in bf16, half the memory.

Layout: ``N`` packed rows per direction, row ``k`` = (time t, rank j). Tensors carry a leading
direction axis of 2 (0 forward, 1 backward).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from iaa.model.kernels import gru_kernels
from iaa.model.kernels.support import Support

# Threads for the Python fallback loops. They would open a parallel region for every step's tiny
# matmul, which stalls for milliseconds whenever another process holds the other core, so they run
# on one by default. The C++ kernels need no such setting: each direction's whole loop is one task
# of a single parallel region, so with two torch threads the directions run side by side and never
# wait for each other between steps. Measured: benchmarks/HISTORY.md, "Measurements cited from the
# code".
FALLBACK_THREADS = 1


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` (None keeps torch's setting)."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Packing:
    """Where each packed row comes from in the padded (B, L) layout.

    Attributes:
        batch_sizes: rows active at each step, non-increasing (python ints).
        offsets: first packed row of each step.
        pos: (2, N) flat index b * L + position, for the forward and the backward direction.
        prev: (N,) packed row holding h_{t-1} of the same sequence (N at t = 0, where h_{t-1} = 0).
    """

    batch_sizes: list[int]
    offsets: list[int]
    pos: torch.Tensor
    prev: torch.Tensor


def make_packing(lengths: torch.Tensor, max_len: int) -> Packing:
    """Packing of sequences with ``lengths`` (B,) into time-major order, longest first."""
    lengths = lengths.to("cpu", torch.int64)
    sorted_len, perm = torch.sort(lengths, descending=True, stable=True)
    steps = int(sorted_len[0])
    active = torch.arange(steps).unsqueeze(1) < sorted_len.unsqueeze(0)  # (T, B)
    sizes = active.sum(1)                                                  # (T,)
    t, j = active.nonzero(as_tuple=True)                                   # t-major, j ascending
    b = perm[j]
    pos = torch.stack([b * max_len + t, b * max_len + lengths[b] - 1 - t])  # (2, N)
    offsets = torch.cumsum(sizes, 0) - sizes                               # (T,)
    prev = torch.where(t > 0, offsets[(t - 1).clamp_min(0)] + j, torch.full_like(t, t.numel()))
    return Packing(sizes.tolist(), offsets.tolist(), pos, prev)


def _forward_steps(gi: torch.Tensor, w_hh_t: torch.Tensor, b_hn: torch.Tensor, pk: Packing):
    """Run the recurrence. gi: (2, N, 3h) input projections, which already include b_hr and b_hz.

    Returns the outputs h_t (2, N, h), the gates [r, z] (2, N, 2h), the candidate states n_t
    (2, N, h), and per step ``h_{t-1} W_hh^T`` with b_hn added to its n part (a list of
    (2, n, 3h), kept for backward).
    """
    _, n_rows, h3 = gi.shape
    h = h3 // 3
    out = gi.new_empty(2, n_rows, h)
    rz = gi.new_empty(2, n_rows, 2 * h)
    cand = gi.new_empty(2, n_rows, h)
    gh_steps = []
    h_prev = gi.new_zeros(2, pk.batch_sizes[0], h)
    for n, off in zip(pk.batch_sizes, pk.offsets):
        rows = slice(off, off + n)
        h_prev = h_prev[:, :n]
        gh = torch.bmm(h_prev, w_hh_t)                                    # (2, n, 3h)
        gh[..., 2 * h:].add_(b_hn)
        gates = rz[:, rows]
        torch.add(gi[:, rows, : 2 * h], gh[..., : 2 * h], out=gates).sigmoid_()
        c = cand[:, rows]
        torch.addcmul(gi[:, rows, 2 * h:], gates[..., :h], gh[..., 2 * h:], out=c).tanh_()
        h_prev = torch.lerp(c, h_prev, gates[..., h:], out=out[:, rows])  # n + z (h_prev - n)
        gh_steps.append(gh)
    return out, rz, cand, gh_steps


def _backward_steps(d_out, out, rz, cand, gh_steps, w_hh, pk: Packing):
    # gh_steps: per step h_{t-1} W_hh^T with b_hn in its n part, from _forward_steps
    """Back-propagate through the recurrence. d_out: (2, N, h), modified in place.

    Returns d_gh (2, N, 3h), the gradient of ``h_{t-1} W_hh^T + b_hh``, and d_gi (2, N, 3h),
    the gradient of the input projections: r and z add both projections, so only the n parts
    differ (d_gi's is the gradient of the candidate's pre-activation).
    """
    _, n_rows, h = out.shape
    d_gh = out.new_empty(2, n_rows, 3 * h)
    d_gi = out.new_empty(2, n_rows, 3 * h)
    zero = out.new_zeros(())
    for step in range(len(pk.batch_sizes) - 1, -1, -1):
        n, off = pk.batch_sizes[step], pk.offsets[step]
        rows = slice(off, off + n)
        dh = d_out[:, rows]
        r, z = rz[:, rows, :h], rz[:, rows, h:]
        c = cand[:, rows]
        prev_rows = slice(pk.offsets[step - 1], pk.offsets[step - 1] + n) if step else None
        h_prev = out[:, prev_rows] if step else zero
        d_c = torch.addcmul(dh, dh, z, value=-1.0)                       # dh (1 - z)
        d_cpre = torch.addcmul(d_c, d_c * c, c, value=-1.0, out=d_gi[:, rows, 2 * h:])  # (1 - n^2)
        d_z = dh * (h_prev - c)
        torch.mul(d_z, torch.addcmul(z, z, z, value=-1.0), out=d_gh[:, rows, h: 2 * h])
        torch.mul(d_cpre * gh_steps[step][..., 2 * h:], torch.addcmul(r, r, r, value=-1.0),
                  out=d_gh[:, rows, :h])
        torch.mul(d_cpre, r, out=d_gh[:, rows, 2 * h:])
        d_gi[:, rows, : 2 * h] = d_gh[:, rows, : 2 * h]
        if step:
            d_out[:, prev_rows].addcmul_(dh, z).baddbmm_(d_gh[:, rows], w_hh)  # d h_{t-1}
    return d_gh, d_gi


def stack_weights(w_ih_f, w_hh_f, b_ih_f, b_hh_f, w_ih_b, w_hh_b, b_ih_b, b_hh_b):
    """Both directions stacked: W_ih (2, 3h, d), W_hh (2, 3h, h), b_hh (2, 1, 3h), and the input
    bias b_in = b_ih + [b_hr, b_hz, 0] (2, 1, 3h): r and z add both biases, so they fold."""
    w_ih, w_hh = torch.stack([w_ih_f, w_ih_b]), torch.stack([w_hh_f, w_hh_b])
    b_hh = torch.stack([b_hh_f, b_hh_b]).unsqueeze(1)
    b_in = torch.stack([b_ih_f, b_ih_b]).unsqueeze(1).clone()
    b_in[..., : 2 * w_hh.shape[2]] += b_hh[..., : 2 * w_hh.shape[2]]
    return w_ih, w_hh, b_hh, b_in


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)`` over the direction axis, as one 2-D ``mm`` per direction (in the
    operands' dtype; fp32 accumulation in bf16). In fp32 the two are equally fast; in bf16 see
    docs/speed.md, "bf16 on CPU"."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for k in range(a.shape[0]):
        torch.mm(a[k], b[k], out=out[k])
    return out


# Under bf16 each direction's packed rows are padded with zero rows to a multiple of this: the
# bf16 GEMMs over the tokens (projection, input and weight gradients) then see few shapes. oneDNN
# builds a kernel for every new shape, 5 to 11 ms each at these sizes, and every batch has its
# own token count. fp32 GEMMs (MKL) build nothing per shape and are not padded.
GEMM_ROWS = 256


def _padded_rows(n: int) -> int:
    return -(-n // GEMM_ROWS) * GEMM_ROWS


def use_amx(kernels, bf16: bool, h: int) -> bool:
    """Whether the recurrent matmuls run on AMX: in bf16 only, where the CPU has AMX."""
    return kernels is not None and bf16 and kernels.amx_paths(h)


def recurrence(gi: torch.Tensor, b_in: torch.Tensor | None, w_hh: torch.Tensor, b_hh: torch.Tensor,
                pk: Packing, bf16: bool, keep: bool, cpp: ModuleType | None, threads: int | None):
    """Forward recurrence from the input projections gi (2, N, 3h), in C++ (``cpp``, the built
    ``gru_kernels``) or, with ``cpp=None``, in the Python loop on ``threads`` threads.

    gi is fp32 or bf16; ``b_in`` (2, 1, 3h), when given, is added in fp32 (gi is then the bare
    GEMM result). ``bf16``: the recurrent matmuls h_{t-1} W_hh^T take bf16 operands (AMX) where
    the CPU runs them fast. ``keep``: also return what backward needs (else the C++ path returns
    empty gates, candidates and hn). The state and outputs are fp32 (the weights' dtype).
    """
    kernels = cpp if gi.is_cpu else None
    h = w_hh.shape[2]
    b_hn = b_hh[..., 2 * h:]                                            # (2, 1, h)
    if kernels is not None:
        bias = b_in.squeeze(1) if b_in is not None else gi.new_empty(0)
        out, rz, cand, hn = kernels.gru_forward(gi, bias, w_hh.transpose(1, 2), use_amx(kernels, bf16, h), b_hn.squeeze(1),
                                                pk.batch_sizes, pk.offsets, keep)
    else:
        gi = gi.to(w_hh.dtype)
        if b_in is not None:
            gi = gi + b_in
        with _threads(threads):
            out, rz, cand, hn = _forward_steps(gi, w_hh.transpose(1, 2), b_hn, pk)
    return out, rz, cand, hn, kernels


def unpack(out: torch.Tensor, pos: torch.Tensor, batch: int, max_len: int) -> torch.Tensor:
    """Packed outputs (2, N, h) to (B, L, 2h), zero at padding."""
    h = out.shape[-1]
    y = out.new_zeros(batch * max_len, 2, h)
    y[:, 0].index_copy_(0, pos[0], out[0])
    y[:, 1].index_copy_(0, pos[1], out[1])
    return y.view(batch, max_len, 2 * h)


class FusedBiGRU(torch.autograd.Function):
    """y = BiGRU(x) over the real tokens of each row. See the module docstring.

    The recurrence runs in ``cpp`` (the built ``gru_kernels``), or in the Python loops above on
    ``threads`` threads when ``cpp`` is None.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)  # bf16 only where asked
    def forward(ctx, x, lengths, bf16, cpp, threads, *weights):
        batch, max_len, dim = x.shape
        pk = make_packing(lengths, max_len)
        pos = pk.pos.to(x.device)
        w_ih, w_hh, b_hh, b_in = stack_weights(*weights)
        if bf16:                                                        # bf16 operands, kept for backward
            x, w_ih = x.to(torch.bfloat16), w_ih.to(torch.bfloat16)
        n = pos.shape[1]
        rows = _padded_rows(n) if bf16 and x.is_cpu and cpp is not None else n
        xp = x.new_empty(2, rows, dim)                                  # (2, N', d): N real rows, then zeros
        xp[:, n:].zero_()
        for k in range(2):
            torch.index_select(x.reshape(batch * max_len, dim), 0, pos[k], out=xp[k, :n])
        gi = _bmm(xp, w_ih.transpose(1, 2))                             # (2, N', 3h), bf16 or fp32
        if not bf16:
            gi, b_in = gi.add_(b_in), None
        keep = any(ctx.needs_input_grad)
        out, rz, cand, hn, kernels = recurrence(gi, b_in, w_hh, b_hh, pk, bf16, keep, cpp, threads)
        ctx.pk, ctx.shape, ctx.hn, ctx.kernels, ctx.threads = pk, x.shape, hn, kernels, threads
        ctx.amx = use_amx(kernels, bf16, w_hh.shape[2])
        ctx.save_for_backward(xp, pos, w_ih, w_hh, out, rz, cand)
        return unpack(out[:, :n], pos, batch, max_len)                 # (B, L, 2h)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    @once_differentiable
    def backward(ctx, grad_y):
        xp, pos, w_ih, w_hh, out, rz, cand = ctx.saved_tensors
        pk, (batch, max_len, dim), hn, kernels = ctx.pk, ctx.shape, ctx.hn, ctx.kernels
        h, n, rows = out.shape[-1], pos.shape[1], out.shape[1]          # rows: N padded (bf16)
        grad_y = grad_y.reshape(batch * max_len, 2, h)
        d_out = grad_y.new_empty(2, rows, h)                            # (2, N', h); padding never read
        for k in range(2):
            torch.index_select(grad_y[:, k], 0, pos[k], out=d_out[k, :n])
        fast = (kernels is not None and out.dtype == torch.float32 and kernels.fast_paths(h)
                and kernels.fast_paths(dim))                            # AVX-512, fp32 state
        if kernels is not None:
            d_gh, d_gi, d_b_hh, d_bn = kernels.gru_backward(d_out, out, rz, cand, hn, w_hh, ctx.amx,
                                                            pk.batch_sizes, pk.offsets,
                                                            fast and xp.dtype == torch.bfloat16)
        else:
            with _threads(ctx.threads):
                d_gh, d_gi = _backward_steps(d_out, out, rz, cand, hn, w_hh, pk)
            d_b_hh, d_bn = d_gh.sum(1), d_gi[..., 2 * h:].sum(1)
        first = pk.batch_sizes[0]                                       # rows of t = 0: h_prev = 0
        prev = pk.prev[first:].to(out.device)
        if rows > n:                                                    # padding: d_gh is 0 there
            prev = torch.cat([prev, prev.new_zeros(rows - n)])
        h_prev = out.index_select(1, prev)                              # (2, N' - first, h)
        d_b_ih = torch.cat([d_b_hh[:, : 2 * h], d_bn], 1)
        # The weight-gradient GEMMs take bf16 operands when the forward's projection did: d_gi
        # and d_gh (bf16 from the fast path, else cast once) serve d_w_ih and d_x, and d_w_hh
        # with h cast once. The bias gradients d_b_hh (2, 3h) and d_b_ih are fp32 sums.
        d_gh_rows = d_gh[:, first:].to(xp.dtype)
        d_w_hh = _bmm(d_gh_rows.transpose(1, 2), h_prev.to(xp.dtype)).to(w_hh.dtype)  # (2, 3h, h)
        d_gi, full = d_gi.to(xp.dtype), w_hh.dtype
        d_w_ih = _bmm(d_gi.transpose(1, 2), xp).to(full)                # (2, 3h, d)
        d_xp = _bmm(d_gi, w_ih)                                         # (2, N, d)
        if fast:
            d_x = kernels.scatter_rows(d_xp, pos, batch * max_len)
        else:
            d_xp = d_xp[:, :n].to(full)
            d_x = d_xp.new_zeros(batch * max_len, dim)
            d_x.index_copy_(0, pos[0], d_xp[0]).index_add_(0, pos[1], d_xp[1])
        return (d_x.view(batch, max_len, dim), None, None, None, None,
                d_w_ih[0], d_w_hh[0], d_b_ih[0], d_b_hh[0],
                d_w_ih[1], d_w_hh[1], d_b_ih[1], d_b_hh[1])


def fused_bigru(x: torch.Tensor, lengths: torch.Tensor, weights: list[torch.Tensor], bf16: bool = False,
                cpp: ModuleType | None = None, threads: int | None = FALLBACK_THREADS) -> torch.Tensor:
    """Bidirectional GRU over real tokens.

    Args:
        x: (B, L, d) inputs; row b is real at positions [0, lengths[b]).
        lengths: (B,) int64, each >= 1.
        weights: ``nn.GRU(bidirectional=True)._flat_weights`` (8 tensors: ih, hh, b_ih, b_hh for
            the forward then the reverse direction).
        bf16: give the input-projection, input-gradient and W_ih weight-gradient GEMMs bf16 operands
            (fp32 accumulation). The recurrent matmuls then take bf16 operands where the CPU has
            AMX; the state and everything returned stay fp32.
        cpp: the built ``gru_kernels`` (``gru_kernels.load()``), or None for the Python loops.
        threads: torch threads of the Python loops (None: torch's setting).

    Returns:
        (B, L, 2h): [forward, backward] states at real positions, exactly 0 at padding; fp32.
    """
    return FusedBiGRU.apply(x, lengths, bf16, cpp, threads, *weights)


def gru_weights(gru: nn.GRU) -> list[torch.Tensor]:
    """The 8 parameters of a one-layer bidirectional ``nn.GRU`` in ``_flat_weights`` order (ih, hh,
    b_ih, b_hh forward, then reverse), read by name: after a ``torch.func.functional_call``
    (the reference encoder's bf16 pass) ``gru._flat_weights`` still holds that call's copies."""
    return [getattr(gru, f"{name}_l0{suffix}") for suffix in ("", "_reverse")
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]


class FusedEncoder:
    """The encoders' BiGRU (``fused_bigru``) in place of ``nn.GRU`` over packed sequences (CPU).

    ``cpp``: the built ``gru_kernels`` (its AVX-512 and AMX paths chosen at run time), or None
    for the Python loops, on ``threads`` threads. In bf16 the large GEMMs take bf16 operands.
    """

    slot, switch = "encoder", "fused_gru"
    support = Support(devices=frozenset({"cpu"}))

    def __init__(self, precision: str = "fp32", cpp: ModuleType | None = None,
                 threads: int | None = FALLBACK_THREADS) -> None:
        self.bf16, self.cpp, self.threads = precision == "bf16", cpp, threads

    @classmethod
    def make(cls, cfg, precision: str) -> "FusedEncoder":
        return cls(precision, gru_kernels.load())

    def encode(self, x: torch.Tensor, lengths: torch.Tensor, gru: nn.GRU) -> torch.Tensor:
        """x: (B, L, d), lengths: (B,) -> states (B, L, 2h), 0 at padding, fp32."""
        return fused_bigru(x, lengths, gru_weights(gru), self.bf16, self.cpp, self.threads)

    def amx_recurrence(self, h: int) -> bool:
        """Whether the recurrent matmuls of hidden size ``h`` multiply on AMX."""
        return use_amx(self.cpp, self.bf16, h)
