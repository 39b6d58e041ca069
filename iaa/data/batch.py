"""The padded batch that the loader yields and the reader consumes."""

from __future__ import annotations

from dataclasses import dataclass, fields

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

    def __len__(self) -> int:
        return len(self.example_ids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
            if isinstance(getattr(self, f.name), torch.Tensor)
            else getattr(self, f.name)
            for f in fields(self)
        }
        return Batch(**moved)
