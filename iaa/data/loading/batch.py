"""The padded batch that the loader yields and the reader consumes."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass
class Batch:
    """A padded batch of cloze examples. Masks are boolean, True for a real token.

    ``teacher`` is present only where the table has a ``teacher_probs`` column
    (``iaa-cli distill``).

    ``doc_cand[b, i]`` is the index (into the example's candidates) of the word at document
    position ``i``, or -1 when that word is no candidate or is padding. It is computed from the
    words themselves, so two candidates that both map to ``<unk>`` stay apart.
    """

    doc: torch.Tensor         # (B, Ld) int64 token ids
    doc_mask: torch.Tensor    # (B, Ld) bool
    query: torch.Tensor       # (B, Lq) int64 token ids
    query_mask: torch.Tensor  # (B, Lq) bool
    doc_cand: torch.Tensor    # (B, Ld) int64 candidate index, -1 for none
    cand_mask: torch.Tensor   # (B, C) bool, True for a real candidate
    answer: torch.Tensor      # (B,) int64 index into candidates
    example_ids: list[str]
    teacher: torch.Tensor | None = None  # (B, C) float32 soft targets over the candidates (distillation)
    doc_lengths: torch.Tensor | None = None    # (B,) int64, always on the CPU: doc_mask.sum(1)
    query_lengths: torch.Tensor | None = None  # (B,) int64, always on the CPU: query_mask.sum(1)

    def __len__(self) -> int:
        return len(self.example_ids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """The tensors on ``device`` (the lengths stay on the host, where packing reads them)."""
        return self.map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """The tensors in page-locked memory, so that ``to(cuda, non_blocking=True)`` is asynchronous."""
        return self.map_tensors(torch.Tensor.pin_memory)

    def map_tensors(self, fn) -> "Batch":
        """A batch with ``fn`` applied to each tensor but the host-side lengths."""
        host = ("doc_lengths", "query_lengths", "example_ids")
        return Batch(**{f.name: getattr(self, f.name) if f.name in host or getattr(self, f.name) is None
                        else fn(getattr(self, f.name)) for f in fields(self)})


def bucket_width(length: int, smallest: int = 16) -> int:
    """The smallest of smallest x {1, 1.5} x 2^k that holds ``length``: a few widths per octave,
    so that padding to them wastes at most a third and a compiled reader sees few shapes."""
    width = smallest
    while True:
        for candidate in (width, width * 3 // 2):
            if candidate >= length:
                return candidate
        width *= 2


def pad_to_buckets(batch: Batch) -> Batch:
    """``batch`` with Ld and Lq padded to ``bucket_width`` (masks False, doc_cand -1, tokens 0).

    Padding never changes a reader's output (the masks exclude it); it only fixes the shapes.
    """
    return pad_to_widths(batch, bucket_width(batch.doc.shape[1]), bucket_width(batch.query.shape[1]))


DOC_MULTIPLE, QUERY_MULTIPLE = 32, 8   # pad_to_multiple's steps: a few percent of padding


def pad_to_multiple(batch: Batch) -> Batch:
    """``batch`` with Ld padded to a multiple of ``DOC_MULTIPLE`` and Lq of ``QUERY_MULTIPLE``.

    For the CPU's heap: the activations of a step are sized by the batch's widths, and glibc's
    heap reuses a freed block only for a request that fits it, so with a new width at almost
    every batch the heap grows with the steps. With a few dozen widths the same sizes recur and
    it stops growing (the AS Reader at the ``cbt-cn`` preset: 7.9 GB resident after 3,000 steps
    and still growing as loaded, 4.1 GB and flat padded, no slower; ``benchmarks/bench_memory.py``).
    """
    up = lambda length, multiple: -(-length // multiple) * multiple   # noqa: E731
    return pad_to_widths(batch, up(batch.doc.shape[1], DOC_MULTIPLE), up(batch.query.shape[1], QUERY_MULTIPLE))


def pad_to_widths(batch: Batch, doc_width: int, query_width: int) -> Batch:
    """``batch`` with Ld padded to ``doc_width`` and Lq to ``query_width`` (each at least the batch's)."""
    ld, lq = batch.doc.shape[1], batch.query.shape[1]
    if (doc_width, query_width) == (ld, lq):
        return batch
    pad = lambda t, width, fill: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)  # noqa: E731
    return replace(batch, doc=pad(batch.doc, doc_width, 0), doc_mask=pad(batch.doc_mask, doc_width, False),
                   doc_cand=pad(batch.doc_cand, doc_width, -1), query=pad(batch.query, query_width, 0),
                   query_mask=pad(batch.query_mask, query_width, False))
