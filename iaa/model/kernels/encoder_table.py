"""The document encoder in inference from a per-word table of its input projections (CPU).

``input_table`` computes every word's X W_ih^T + b_in once; ``bigru_from_table`` then looks each
token's projections up instead of multiplying, and runs the same recurrence as
``fused_gru.fused_bigru`` (its packed layout, C++ loops and Python fallback). No gradient:
training runs ``fused_gru.FusedEncoder``.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from iaa.model.kernels import gru_kernels
from iaa.model.kernels.fused_gru import (FALLBACK_THREADS, use_amx, recurrence, stack_weights, unpack, gru_weights,
                                         make_packing)
from iaa.model.kernels.support import Support
from iaa.model.kernels.kernel_internals import version


def input_table(embedding: torch.Tensor, weights: list[torch.Tensor],
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """Every word's input projection, (2, V, 3h): X W_ih^T + b_in for each direction.

    For inference without input dropout, ``bigru_from_table`` then looks projections up instead
    of multiplying: the same values, computed once per word instead of once per token. ``dtype``
    bf16 (what ``fused_bigru`` does under CPU autocast with bf16): bf16 operands, the bias added
    in the fp32 accumulator, one rounding of each entry to bf16, half the memory; None: the
    embedding's dtype.
    """
    with torch.autocast(embedding.device.type, enabled=False):
        w_ih, _, _, b_in = stack_weights(*weights)
        dtype = dtype or embedding.dtype
        x = embedding.to(dtype)
        return torch.stack([torch.addmm(b_in[k].to(dtype), x, w_ih[k].to(dtype).t()) for k in range(2)])


@torch.no_grad()
def bigru_from_table(tokens: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor,
                     weights: list[torch.Tensor], cpp: ModuleType | None = None,
                     threads: int | None = FALLBACK_THREADS) -> torch.Tensor:
    """``fused_bigru(embedding[tokens], ...)`` for inference, from ``input_table``'s projections.

    Args:
        tokens: (B, L) int64 word ids. lengths: (B,). table: (2, V, 3h). weights, cpp, threads:
            as ``fused_bigru``.

    Returns:
        (B, L, 2h), exactly 0 at padding, fp32 (the recurrence runs in fp32 from a bf16 table
        too, as ``fused_bigru``; a bf16 table also gives the recurrent matmuls bf16 operands
        where the CPU has AMX). No gradient.
    """
    with torch.autocast(tokens.device.type, enabled=False):
        return _bigru_from_table(tokens, lengths, table, weights, cpp, threads)


def _bigru_from_table(tokens, lengths, table, weights, cpp, threads):
    batch, max_len = tokens.shape
    pk = make_packing(lengths, max_len)
    pos = pk.pos.to(tokens.device)
    _, w_hh, b_hh, _ = stack_weights(*weights)
    h = w_hh.shape[2]
    words = tokens.reshape(-1)[pos]                                     # (2, N)
    bf16 = table.dtype == torch.bfloat16
    kernels = cpp if tokens.is_cpu else None
    if kernels is not None and w_hh.dtype == torch.float32 and kernels.fast_paths(h):  # reads the table in place
        y = kernels.gru_infer(table, words, pos, w_hh.transpose(1, 2), use_amx(kernels, bf16, h), b_hh[:, 0, 2 * h:],
                              pk.batch_sizes, pk.offsets, batch * max_len)
        return y.view(batch, max_len, 2 * h)
    gi = torch.stack([table[k].index_select(0, words[k]) for k in range(2)])  # (2, N, 3h)
    out = recurrence(gi, None, w_hh, b_hh, pk, bf16, False, kernels, threads)[0]   # (2, N, h)
    return unpack(out, pos, batch, max_len)



class EncoderTable:
    """Inference of the document encoder from a per-word table of its input projections
    (``input_table``, ``bigru_from_table``; CPU, no dropout, no gradient): V x 6h numbers, 154 MB
    in fp32 at the paper config, 77 MB in bf16. It is rebuilt whenever the embedding or the
    encoder's weights change, and after ``forget`` (each training pass: an optimiser may change
    weights in place without bumping their version)."""

    slot, switch = "table", "inference_table"
    support = Support(devices=frozenset({"cpu"}))

    def __init__(self, precision: str = "fp32", cpp: ModuleType | None = None,
                 threads: int | None = FALLBACK_THREADS) -> None:
        self.dtype = torch.bfloat16 if precision == "bf16" else None      # None: the embedding's
        self.cpp, self.threads = cpp, threads
        self._table: tuple[tuple, torch.Tensor] | None = None

    @classmethod
    def make(cls, cfg, precision: str) -> "EncoderTable | None":
        return cls(precision, gru_kernels.load()) if cfg.fused_gru else None

    def forget(self) -> None:
        self._table = None

    @torch.no_grad()
    def table(self, embedding: torch.Tensor, gru: nn.GRU) -> torch.Tensor:
        """The per-word projections (2, V, 3h), rebuilt when any weight changed."""
        weights = gru_weights(gru)
        key = (self.dtype, *((p.data_ptr(), version(p)) for p in (embedding, *weights)))
        if self._table is None or self._table[0] != key:
            self._table = None                                             # free the old one first
            self._table = (key, input_table(embedding, weights, self.dtype))
        return self._table[1]

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor, embedding: torch.Tensor,
               gru: nn.GRU) -> torch.Tensor:
        """tokens: (B, L) word ids, lengths: (B,) -> states (B, L, 2h) of ``gru`` over
        ``embedding[tokens]``, 0 at padding, fp32."""
        return bigru_from_table(tokens, lengths, self.table(embedding, gru), gru_weights(gru), self.cpp,
                                self.threads)
