"""The reader's slots: one callable per slot, each with the reference's signature.

The reader (``iaa.model.reader``) hands ``Kernels.slots`` its reference functions; each slot
gets the chosen kernel's callable, else the reference's own. The reader then calls each slot at
one site and makes no other choice. Where a kernel computes only part of what its slot does
(inference without gradients, no trace), its callable decides that and runs the reference
otherwise, so those decisions live here and in the kernels, not in the reader's ``forward``.

Every callable is a bound method or a small object, never a closure, so that a deep copy of a
reader copies its kernels' caches with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Slots:
    """One callable per slot (names as ``Kernels``' fields), with these signatures:

    encoder: (x (B, L, d), lengths (B,) beside x, gru, host lengths (B,) | None) -> (B, L, 2h),
        0 at padding (``BiGRUEncoder``).
    table: (encoders, batch, slots) -> q̃ (B, Lq, 2h), the query's final states (B, 2h),
        d̃ (B, Ld, 2h): the encoders over a batch.
    reads: (d̃ (B, Ld, 2h)) -> the document's ``Encodings`` for the steps' reads.
    layers: () -> a context manager yielding the steps' ``Layers`` for one forward pass.
    steps: (reader, q̃, d̃, masks, slots, trace) -> the last step's document logits (B, Ld) and
        the steps' records (with ``trace``, else None): the IAA reader's T steps.
    dropout: (x, p) -> x with inverted dropout p (training only; the caller skips p = 0).
    """

    encoder: Callable
    table: Callable
    reads: Callable
    layers: Callable
    steps: Callable
    dropout: Callable


@dataclass(frozen=True)
class EncoderSlot:
    """A kernel's ``encode(x, lengths, gru)`` in the encoder slot (host lengths unused)."""

    kernel: Any

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor, gru: torch.nn.GRU,
                 host_lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.kernel.encode(x, lengths, gru)


@dataclass(frozen=True)
class TableSlot:
    """The document encoder read from a per-word table in inference (no gradient, eval mode),
    the reference otherwise."""

    kernel: Any
    reference: Callable

    def __call__(self, encoders, batch, slots: Slots):
        if encoders.training or torch.is_grad_enabled():
            return self.reference(encoders, batch, slots)
        q_enc, q_final = encoders.query_encoder(encoders.embed(batch.query), batch.query_mask,
                                                getattr(batch, "query_lengths", None), encode=slots.encoder)
        d_enc = self.kernel.encode(batch.doc, batch.doc_mask.sum(1), encoders.embedding.weight,
                                   encoders.doc_encoder.gru)                 # (B, Ld, 2h)
        return q_enc, q_final, d_enc


@dataclass(frozen=True)
class StepsSlot:
    """The IAA reader's T steps in one fused call in inference (no gradient, eval mode, no
    trace), the reference otherwise."""

    kernel: Any
    reference: Callable

    def __call__(self, reader, q_enc, d_enc, masks, slots: Slots, trace: bool):
        if trace or reader.training or torch.is_grad_enabled():
            return self.reference(reader, q_enc, d_enc, masks, slots, trace)
        layers = [reader.query_read.proj, reader.doc_read.proj, reader.gate_q.hidden, reader.gate_q.out,
                  reader.gate_d.hidden, reader.gate_d.out]
        return self.kernel.last_logits(layers, reader.search, q_enc, d_enc, masks.query, masks.doc,
                                       reader.cfg.steps), None


@dataclass(frozen=True)
class LayersSlot:
    """A kernel's layers for one forward pass: its block, with gradients where they flow."""

    kernel: Any

    def __call__(self):
        return self.kernel.block(torch.is_grad_enabled())


@dataclass(frozen=True)
class Forgetting:
    """The table slot, after dropping the caches of weights of ``kernels`` in training mode: an
    optimiser may change the weights in place without bumping their version (fused Adam does
    not), so a cache keyed by version alone could serve stale ones."""

    inner: Callable
    kernels: Sequence[Any]

    def __call__(self, encoders, batch, slots: Slots):
        if encoders.training:
            for kernel in self.kernels:
                kernel.forget()
        return self.inner(encoders, batch, slots)
