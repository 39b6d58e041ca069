"""The padded batch that the loader yields and the reader consumes."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """A padded batch of cloze examples. Masks are boolean, True for a real token.

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
    doc_lengths: torch.Tensor | None = None    # (B,) int64, always on the CPU: doc_mask.sum(1)
    query_lengths: torch.Tensor | None = None  # (B,) int64, always on the CPU: query_mask.sum(1)

    def __len__(self) -> int:
        return len(self.example_ids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """The tensors on ``device`` (the lengths stay on the host, where packing reads them)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """The tensors in page-locked memory, so that ``to(cuda, non_blocking=True)`` is asynchronous."""
        return self._map(torch.Tensor.pin_memory)

    def _map(self, fn) -> "Batch":
        host = ("doc_lengths", "query_lengths", "example_ids")
        return Batch(**{f.name: getattr(self, f.name) if f.name in host or getattr(self, f.name) is None
                        else fn(getattr(self, f.name)) for f in fields(self)})
