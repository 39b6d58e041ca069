"""What a reader reads from a batch, as a Protocol: the model depends only on torch.

``iaa.data.loading.batch.Batch`` (the loader's padded batch) satisfies it, and so does any object with
these tensors, e.g. a test's hand-made batch. A batch may also carry ``doc_lengths`` and
``query_lengths``, (B,) int64 on the CPU (the masks' row sums): the ``nn.GRU`` encoders pack by
them without reading the masks back from a GPU.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ReaderInputs(Protocol):
    """A padded batch of cloze examples. Masks are boolean, True for a real token."""

    doc: torch.Tensor         # (B, Ld) int64 token ids
    doc_mask: torch.Tensor    # (B, Ld) bool
    query: torch.Tensor       # (B, Lq) int64 token ids
    query_mask: torch.Tensor  # (B, Lq) bool
    doc_cand: torch.Tensor    # (B, Ld) int64 candidate index at each position, -1 for none
    cand_mask: torch.Tensor   # (B, C) bool, True for a real candidate
