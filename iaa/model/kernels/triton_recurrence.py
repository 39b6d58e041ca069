"""The Triton kernels of ``triton_gru``: the BiGRU's recurrence forward and backward.

Imported only where the kernel runs, since Triton is optional, and at that import Triton reads
``TRITON_INTERPRET`` (1: the kernels run on the CPU through its interpreter).
"""

import triton
import triton.language as tl


@triton.jit
def _rows(lengths, batch, rows_per: tl.constexpr):
    """This program's rows, its direction (0 forward, 1 backward) and the rows' lengths (0 past B)."""
    rows = tl.program_id(0) * rows_per + tl.arange(0, rows_per)
    return rows, tl.program_id(1), tl.load(lengths + rows, mask=rows < batch, other=0)


@triton.jit
def _step(rows, d, t, lens, length):
    """Step t of direction d: which rows take it, and the flat (B, L, 2) rows of their position
    and of the position before it in that direction (the backward one reversed within its length)."""
    pos = tl.where(d == 0, t, lens - 1 - t)
    return t < lens, (rows * length + pos) * 2 + d, (rows * length + tl.where(d == 0, pos - 1, pos + 1)) * 2 + d


@triton.jit
def _products(src, at, valid, w, h: tl.constexpr, hp: tl.constexpr, chunk: tl.constexpr,
              rows_per: tl.constexpr, transposed: tl.constexpr):
    """Σ_k v[k] M_g[k, :] for the three gates g: v the (rows, 3h) or (rows, h) rows of ``src``
    at the flat row indices ``at``, read ``chunk`` columns at a time, and M_g = W_hg^T
    (``transposed``) or W_hg, W_hg the g-th (h, h) block of ``w`` (3h, h). Reading v back from
    memory in chunks keeps a program's registers to a (chunk, h) tile of W at a time."""
    j = tl.arange(0, hp)
    a_r = tl.zeros((rows_per, hp), dtype=src.dtype.element_ty)
    a_z = tl.zeros((rows_per, hp), dtype=src.dtype.element_ty)
    a_n = tl.zeros((rows_per, hp), dtype=src.dtype.element_ty)
    for k0 in tl.static_range(0, hp, chunk):
        k = k0 + tl.arange(0, chunk)
        tile_mask = (k < h)[:, None] & (j < h)[None, :]
        v_mask = valid[:, None] & (k < h)[None, :]
        if transposed:            # M[k, j] = W[g*h + j, k]; v is the state, (rows, h)
            m = w + j[None, :] * h + k[:, None]
            v_r = tl.load(src + (at * h)[:, None] + k[None, :], mask=v_mask, other=0.0)
            v_z = v_r
            v_n = v_r
        else:                     # M[k, j] = W[g*h + k, j]; v is the gates' gradient, (rows, 3h)
            m = w + k[:, None] * h + j[None, :]
            v = src + (at * 3 * h)[:, None] + k[None, :]
            v_r = tl.load(v, mask=v_mask, other=0.0)
            v_z = tl.load(v + h, mask=v_mask, other=0.0)
            v_n = tl.load(v + 2 * h, mask=v_mask, other=0.0)
        a_r += tl.dot(v_r, tl.load(m, mask=tile_mask, other=0.0), input_precision="ieee")
        a_z += tl.dot(v_z, tl.load(m + h * h, mask=tile_mask, other=0.0), input_precision="ieee")
        a_n += tl.dot(v_n, tl.load(m + 2 * h * h, mask=tile_mask, other=0.0), input_precision="ieee")
    return a_r, a_z, a_n


@triton.jit
def forward(gi, w_hh, b_hh, lengths, out, gates, batch, length, h: tl.constexpr, hp: tl.constexpr,
            chunk: tl.constexpr, rows_per: tl.constexpr, save: tl.constexpr):
    """gi (B, L, 2, 3h), w_hh (2, 3h, h), b_hh (2, 3h), lengths (B,) -> out (B, L, 2, h);
    gates (B, L, 2, 4h): r, z, n, W_hn h + b_hn, when ``save``."""
    rows, d, lens = _rows(lengths, batch, rows_per)
    j = tl.arange(0, hp)
    cols = j < h
    w = w_hh + d * 3 * h * h
    b_r = tl.load(b_hh + d * 3 * h + j, mask=cols, other=0.0)[None, :]
    b_z = tl.load(b_hh + d * 3 * h + h + j, mask=cols, other=0.0)[None, :]
    b_n = tl.load(b_hh + d * 3 * h + 2 * h + j, mask=cols, other=0.0)[None, :]
    state = tl.zeros((rows_per, hp), dtype=out.dtype.element_ty)
    t = 0
    while t < length:              # not range(length): Triton's interpreter under NumPy >= 2.4 cannot
        valid, at, before = _step(rows, d, t, lens, length)      # take a scalar argument as its bound
        gh_r, gh_z, gh_n = _products(out, before, valid & (t > 0), w, h, hp, chunk, rows_per, True)
        gh_r += b_r
        gh_z += b_z
        gh_n += b_n
        mask = valid[:, None] & cols[None, :]
        g_ptr = gi + (at * 3 * h)[:, None] + j[None, :]
        r = tl.sigmoid(tl.load(g_ptr, mask=mask, other=0.0) + gh_r)
        z = tl.sigmoid(tl.load(g_ptr + h, mask=mask, other=0.0) + gh_z)
        n = 2.0 * tl.sigmoid(2.0 * (tl.load(g_ptr + 2 * h, mask=mask, other=0.0) + r * gh_n)) - 1.0  # tanh
        state = (1.0 - z) * n + z * state
        tl.store(out + (at * h)[:, None] + j[None, :], state, mask=mask)
        if save:
            s_ptr = gates + (at * 4 * h)[:, None] + j[None, :]
            tl.store(s_ptr, r, mask=mask)
            tl.store(s_ptr + h, z, mask=mask)
            tl.store(s_ptr + 2 * h, n, mask=mask)
            tl.store(s_ptr + 3 * h, gh_n, mask=mask)
        tl.debug_barrier()         # the next step reads this state back, chunk by chunk
        t += 1


@triton.jit
def backward(d_out, gates, out, w_hh, lengths, d_gi, d_gh, batch, length, h: tl.constexpr,
             hp: tl.constexpr, chunk: tl.constexpr, rows_per: tl.constexpr):
    """The gradients of the gates' pre-activations, (B, L, 2, 3h) each: ``d_gi`` of the
    input projection's, ``d_gh`` of W_hh h + b_hh's (they differ in the n gate)."""
    rows, d, lens = _rows(lengths, batch, rows_per)
    j = tl.arange(0, hp)
    cols = j < h
    w = w_hh + d * 3 * h * h
    grad = tl.zeros((rows_per, hp), dtype=out.dtype.element_ty)      # of the state after step t
    t = length - 1
    while t >= 0:
        valid, at, before = _step(rows, d, t, lens, length)
        mask = valid[:, None] & cols[None, :]
        s_ptr = gates + (at * 4 * h)[:, None] + j[None, :]
        r = tl.load(s_ptr, mask=mask, other=0.0)
        z = tl.load(s_ptr + h, mask=mask, other=0.0)
        n = tl.load(s_ptr + 2 * h, mask=mask, other=0.0)
        gh_n = tl.load(s_ptr + 3 * h, mask=mask, other=0.0)
        state = tl.load(out + (before * h)[:, None] + j[None, :], mask=mask & (t > 0), other=0.0)
        g = grad + tl.load(d_out + (at * h)[:, None] + j[None, :], mask=mask, other=0.0)
        dn = g * (1.0 - z) * (1.0 - n * n)
        dz = g * (state - n) * z * (1.0 - z)
        dr = dn * gh_n * r * (1.0 - r)
        gi_ptr = d_gi + (at * 3 * h)[:, None] + j[None, :]
        gh_ptr = d_gh + (at * 3 * h)[:, None] + j[None, :]
        tl.store(gi_ptr, dr, mask=mask)
        tl.store(gi_ptr + h, dz, mask=mask)
        tl.store(gi_ptr + 2 * h, dn, mask=mask)
        tl.store(gh_ptr, dr, mask=mask)
        tl.store(gh_ptr + h, dz, mask=mask)
        tl.store(gh_ptr + 2 * h, dn * r, mask=mask)
        tl.debug_barrier()         # read back below, chunk by chunk
        p_r, p_z, p_n = _products(d_gh, at, valid, w, h, hp, chunk, rows_per, False)
        grad = tl.where(valid[:, None], g * z + p_r + p_z + p_n, grad)
        t -= 1
