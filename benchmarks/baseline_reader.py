"""The straightforward IAA reader, kept for side-by-side speed comparisons.

What a first PyTorch port looks like: ``nn.GRU`` over batches padded to their longest document
(no packing, so the backward direction also reads the padding), ``nn.Dropout``, a dense
``nn.Embedding`` gradient, the L2 term in the loss, ``clip_grad_norm_`` and the default
``torch.optim.Adam``. Same layer sizes, attention, gates and pointer-sum as ``iaa.model``.
Imports only torch (and the ``Batch`` it reads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from iaa.data.loading.batch import Batch
from iaa.model.config import ReaderConfig


def random_batches(examples: list, batch_size: int) -> list[list]:
    """The baseline's batching: examples in the given (random) order, cut into batches, each
    padded to its longest document by ``iaa.jobs.train.bench.collate`` (no length bucketing)."""
    return [examples[i: i + batch_size] for i in range(0, len(examples), batch_size)]


class BaselineReader(nn.Module):
    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        d, h, s = cfg.embed_dim, cfg.hidden_dim, cfg.state_dim
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, d)
        self.drop = nn.Dropout(cfg.dropout)
        self.query_gru = nn.GRU(d, h, batch_first=True, bidirectional=True)
        self.doc_gru = nn.GRU(d, h, batch_first=True, bidirectional=True)
        self.query_att = nn.Linear(s, 2 * h)
        self.doc_att = nn.Linear(s + 2 * h, 2 * h)
        self.gate_q = nn.Sequential(nn.Linear(s + 6 * h, cfg.gate_dim), nn.Tanh(),
                                    nn.Linear(cfg.gate_dim, 2 * h), nn.Sigmoid())
        self.gate_d = nn.Sequential(nn.Linear(s + 6 * h, cfg.gate_dim), nn.Tanh(),
                                    nn.Linear(cfg.gate_dim, 2 * h), nn.Sigmoid())
        self.search = nn.GRUCell(4 * h, s)
        for name, p in self.named_parameters():
            if "weight_hh" in name:
                for block in p.data.split(p.shape[1], 0):
                    nn.init.orthogonal_(block)
            elif "bias" in name:
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, 0.05)

    def forward(self, batch: Batch) -> torch.Tensor:
        q_enc, _ = self.query_gru(self.drop(self.embedding(batch.query)))
        d_enc, _ = self.doc_gru(self.drop(self.embedding(batch.doc)))
        q_enc, d_enc = self.drop(q_enc), self.drop(d_enc)
        s = d_enc.new_zeros(d_enc.shape[0], self.cfg.state_dim)
        for step in range(self.cfg.steps):
            q_logits = torch.bmm(q_enc, self.query_att(s).unsqueeze(2)).squeeze(2)
            q_att = F.softmax(q_logits.masked_fill(~batch.query_mask, -1e30), -1)
            q_t = torch.bmm(q_att.unsqueeze(1), q_enc).squeeze(1)
            key = self.doc_att(torch.cat([s, q_t], -1))
            d_logits = torch.bmm(d_enc, key.unsqueeze(2)).squeeze(2).masked_fill(~batch.doc_mask, -1e30)
            d_att = F.softmax(d_logits, -1)
            if step == self.cfg.steps - 1:
                break
            d_t = torch.bmm(d_att.unsqueeze(1), d_enc).squeeze(1)
            feats = self.drop(torch.cat([s, q_t, d_t, q_t * d_t], -1))
            s = self.search(torch.cat([self.gate_q(feats) * q_t, self.gate_d(feats) * d_t], -1), s)
        cands = batch.cand_mask.shape[1]
        hits = (batch.doc_cand.unsqueeze(1) == torch.arange(cands).view(1, -1, 1)).float()  # (B, C, Ld)
        return torch.log(torch.bmm(hits, d_att.unsqueeze(2)).squeeze(2) + 1e-12)          # (B, C)


def baseline_optimizer(model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def baseline_train_step(model: BaselineReader, optimizer: torch.optim.Optimizer, batch: Batch, *,
                        embed_l2: float, clip: float = 5.0) -> float:
    model.train()
    log_p = model(batch)
    loss = -log_p.gather(1, batch.answer.view(-1, 1)).mean()
    loss = loss + embed_l2 * model.embedding.weight.pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return float(loss.detach())
