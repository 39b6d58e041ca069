"""The training objective of one batch: the paper's NLL, plus ACT's ponder cost and a teacher's
soft targets where the config asks for them.

    loss = α · NLL + (1 - α) · T² · KL(q_T ‖ p_T) + τ · mean(N + R)

- NLL = -mean log P(a* | Q, D) (paper, "Training Details"); the embedding's L2 term is added by
  :mod:`iaa.jobs.training.step`, which owns the optimiser.
- KL: distillation (Hinton et al. 2015; Hu et al. 2018 for readers). q is the teacher's
  distribution over the candidates (an ensemble's averaged, renormalised pointer-sums: the
  batch's ``teacher``), p the student's own renormalised pointer-sums, both sharpened or
  softened by the temperature T as softmax(log · / T); T² keeps the gradient's scale as T
  changes. α = 1 (the default) is ordinary training and needs no teacher.
- τ · (N + R): ACT's ponder cost (Graves 2016), τ = ``model.ponder_cost``, with
  ``model.halting="act"`` only.

With neither a teacher nor ACT the loss is exactly :func:`iaa.model.pointer.nll_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from iaa.data.loading.batch import Batch
from iaa.errors import IaaError
from iaa.model.halting import Halting
from iaa.model.pointer import nll_loss


@dataclass(frozen=True)
class Objective:
    alpha: float = 1.0          # weight of the gold NLL; 1 - α goes to the teacher
    temperature: float = 1.0    # T
    ponder_cost: float = 0.0    # τ; used when the reader reports halting

    @classmethod
    def from_config(cls, cfg) -> "Objective":
        """The objective of a :class:`~iaa.jobs.config.job_config.JobConfig`."""
        return cls(alpha=cfg.distill.alpha, temperature=cfg.distill.temperature,
                   ponder_cost=cfg.model.ponder_cost if cfg.model.halting == "act" else 0.0)

    def __call__(self, log_p: torch.Tensor, batch: Batch, halting: Halting | None = None) -> torch.Tensor:
        """log_p: (B, C) from the reader; returns the scalar loss."""
        loss = nll_loss(log_p, batch.answer)
        if self.alpha < 1.0:
            loss = self.alpha * loss + (1.0 - self.alpha) * self.soft_loss(log_p, batch)
        if halting is not None and self.ponder_cost > 0:
            loss = loss + self.ponder_cost * halting.ponder.mean()
        return loss

    def soft_loss(self, log_p: torch.Tensor, batch: Batch) -> torch.Tensor:
        """T² · mean KL(q_T ‖ p_T) over the batch, over each example's real candidates."""
        if batch.teacher is None:
            raise IaaError("distill.alpha < 1 needs the teacher's distributions in the training data: "
                           "train with `iaa-cli distill`, or leave distill.alpha at 1")
        mask = batch.cand_mask & (batch.teacher > 0)                           # (B, C)
        t = self.temperature
        log_q = torch.log_softmax(torch.log(batch.teacher).masked_fill(~mask, float("-inf")) / t, 1)
        log_p_t = torch.log_softmax(log_p.masked_fill(~batch.cand_mask, float("-inf")) / t, 1)
        terms = torch.where(mask, log_q.exp() * (log_q - log_p_t.clamp_min(-1e4)), torch.zeros_like(log_p))
        return t * t * terms.sum(1).mean()

