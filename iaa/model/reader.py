"""The readers: the IAA reader, its fixed-query ablation and the AS Reader baseline.

All three share the embedding, the encoders, the masking and the pointer-sum, and map a batch
(``ReaderInputs``, e.g. the loader's ``Batch``) to log P(a | Q, D) for each candidate: (B, C).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from iaa.model.attention import DocRead, FixedQueryRead, Memory, QueryRead, bilinear_logits
from iaa.model.config import ReaderConfig
from iaa.model.dropout import Dropout
from iaa.model.encoder import BiGRUEncoder
from iaa.model.gates import SearchGate, gate_features
from iaa.model.halting import Halting, HaltingUnit, halting_weights, mixture_log, safe_log
from iaa.model.initialization import init_reader_
from iaa.model.inputs import ReaderInputs
from iaa.model.masking import masked_log_softmax
from iaa.model.pointer import pointer_sum


class _Encoders(nn.Module):
    """Shared word embedding X (|V| x d) and separate BiGRU encoders for query and document.

    Dropout (paper, "Training Details") is applied to the input embeddings and to the encodings,
    which are the inputs of the attention mechanisms; one mask per tensor, reused by all T steps.

    In inference on the fused CPU path, the document encoder reads a cached table of every word's
    input projection (``inference_table``, V x 6h floats: 154 MB at the paper config), rebuilt
    whenever the embedding or the encoder's weights change (e.g. after each training step).
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._table: tuple[tuple, torch.Tensor] | None = None             # inference cache
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embed_dim, sparse=cfg.sparse_embedding_grad)
        self.drop = Dropout(cfg.dropout, fast=cfg.fast_dropout)
        self.query_encoder = BiGRUEncoder(cfg.embed_dim, cfg.hidden_dim, fused=cfg.fused_gru,
                                          bf16=cfg.bf16_projections)
        self.doc_encoder = BiGRUEncoder(cfg.embed_dim, cfg.hidden_dim, fused=cfg.fused_gru,
                                        bf16=cfg.bf16_projections)

    def forward(self, batch: ReaderInputs):
        """Returns q̃ (B, Lq, 2h), the query's final states (B, 2h) and d̃ (B, Ld, 2h), before
        the attention-input dropout (each reader drops what its attention reads)."""
        q_emb = self.drop(self.embedding(batch.query))                     # (B, Lq, d)
        q_enc, q_final = self.query_encoder(q_emb, batch.query_mask)       # (B, Lq, 2h), (B, 2h)
        if self._use_table(batch.doc):
            d_enc, _ = self.doc_encoder.forward_from_table(batch.doc, batch.doc_mask, self._doc_table())
            return q_enc, q_final, d_enc
        if self.training:
            self._table = None                                             # stale from here on
        d_emb = self.drop(self.embedding(batch.doc))                       # (B, Ld, d)
        d_enc, _ = self.doc_encoder(d_emb, batch.doc_mask)                 # (B, Ld, 2h)  eq. 1
        return q_enc, q_final, d_enc

    def _use_table(self, doc: torch.Tensor) -> bool:
        """Inference (no dropout, no gradient) on the fused CPU path: look the document's input
        projections up per word instead of computing them per token (same values)."""
        return (self.cfg.inference_table and self.cfg.fused_gru and doc.is_cpu
                and not self.training and not torch.is_grad_enabled())

    def _doc_table(self) -> torch.Tensor:
        """The doc encoder's per-word projections (V, 2, 3h), rebuilt when any weight changed."""
        params = [self.embedding.weight, *self.doc_encoder.gru._flat_weights]
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._table is None or self._table[0] != key:
            self._table = (key, self.doc_encoder.input_table(self.embedding.weight))
        return self._table[1]


def _full_precision(logits: torch.Tensor) -> torch.Tensor:
    """Logits in fp32 at least: under autocast the attention reads compute in bf16, but the
    answer distribution (a log-softmax over hundreds of positions, then the pointer-sum's
    log-sum-exp) keeps full precision, so log P(a) is fp32 whatever the compute dtype."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


def _answer_mask(cfg: ReaderConfig, batch: ReaderInputs) -> torch.Tensor:
    """Positions the answer distribution d_{i,T} ranges over: all real tokens (paper), or only
    candidate positions (Stanford AR / GA Reader, ``candidate_softmax``)."""
    if cfg.candidate_softmax:
        return batch.doc_mask & (batch.doc_cand >= 0)
    return batch.doc_mask


class IAAReader(nn.Module):
    """Iterative Alternating Attention reader (paper section 3); ``iaa-fixed-query`` too.

    s_0 = 0. The paper does not give s_0. A zero state adds no parameters and makes the first
    query read softmax_i(q̃_iᵀ a_q): the learned, query-independent importance bias that the
    paper introduces a_q for, over encodings that already carry the whole query's context. A
    learned s_0 would only shift a_q by the constant A_q s_0; a projection of the query encoding
    would add a layer that the paper does not describe.

    The last step computes only the document attention d_{i,T}: s_T is never read, so its gates
    and GRU update would be dead computation.

    With ``cfg.halting == "act"`` each example takes 1 to T steps (Adaptive Computation Time,
    ``iaa.model.halting``) and the answer distribution mixes the steps' document attentions.
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        two_h, s = 2 * cfg.hidden_dim, cfg.state_dim
        self.cfg = cfg
        self.encoders = _Encoders(cfg)
        self.query_read = FixedQueryRead() if cfg.kind == "iaa-fixed-query" else QueryRead(s, two_h)
        self.doc_read = DocRead(s, two_h)
        self.gate_q = SearchGate(s + 3 * two_h, cfg.gate_dim, two_h)
        self.gate_d = SearchGate(s + 3 * two_h, cfg.gate_dim, two_h)
        self.search = nn.GRUCell(2 * two_h, s)                           # inference GRU
        self.halting_unit = HaltingUnit(s, cfg.steps) if cfg.halting == "act" else None
        init_reader_(self)

    @property
    def embedding(self) -> nn.Embedding:
        return self.encoders.embedding

    def forward(self, batch: ReaderInputs, return_halting: bool = False):
        """Returns log P(a | Q, D): (B, C), -inf for candidates absent from the document; with
        ``return_halting``, also what ACT decided (a ``Halting``; None when ``halting="none"``)."""
        q_enc, _, d_enc = self.encoders(batch)                             # (B, Lq, 2h), (B, Ld, 2h)
        q_enc = self.encoders.drop(q_enc)                                  # attention inputs
        d_enc = Memory(self.encoders.drop(d_enc), deferred=self.cfg.batched_read_grad)
        halting = None
        if self.halting_unit is None:
            log_att = self._fixed_steps(q_enc, d_enc, batch)               # log d_{i,T}: (B, Ld)
        else:
            log_att, halting = self._adaptive_steps(q_enc, d_enc, batch)   # log Σ_t p_t d_{i,t}
        log_p = pointer_sum(log_att, batch.doc_cand, batch.cand_mask.shape[1])  # (B, C) eq. 2
        return (log_p, halting) if return_halting else log_p

    def _fixed_steps(self, q_enc: torch.Tensor, d_enc: Memory, batch: ReaderInputs) -> torch.Tensor:
        """The paper's T steps; returns log d_{i,T}: (B, Ld)."""
        s = q_enc.new_zeros(q_enc.shape[0], self.cfg.state_dim)            # s_0: (B, s)
        for step in range(self.cfg.steps):
            q_t, _ = self.query_read(s, q_enc, batch.query_mask)           # (B, 2h)
            if step == self.cfg.steps - 1:
                logits = self.doc_read.logits(s, q_t, d_enc)               # (B, Ld)
                break
            d_t, _ = self.doc_read(s, q_t, d_enc, batch.doc_mask)          # (B, 2h)
            s = self._search(s, q_t, d_t)                                  # s_t: (B, s)
        return masked_log_softmax(_full_precision(logits), _answer_mask(self.cfg, batch))  # log d_{i,T}

    def _search(self, s: torch.Tensor, q_t: torch.Tensor, d_t: torch.Tensor) -> torch.Tensor:
        """Gated search results into the inference GRU: s_{t-1} -> s_t, (B, s)."""
        features = self.encoders.drop(gate_features(s, q_t, d_t))          # (B, s + 6h)
        r_q, r_d = self.gate_q(features), self.gate_d(features)            # (B, 2h) each
        return self.search(torch.cat([r_q * q_t, r_d * d_t], -1), s)

    def _adaptive_steps(self, q_enc: torch.Tensor, d_enc: Memory, batch: ReaderInputs):
        """ACT over the steps (iaa/model/halting.py): log Σ_t p_t d_{i,t} (B, Ld) and a ``Halting``.

        Under ``torch.no_grad`` (inference) an example that halts leaves the batch, so later steps
        compute only the examples still running; in training they run on, with weight 0, and the
        loop ends when the last example has halted.
        """
        cfg, batch_size = self.cfg, q_enc.shape[0]
        run = _Running.start(q_enc, d_enc, batch, _answer_mask(cfg, batch), cfg.state_dim)
        record = _HaltingRecord(batch_size)
        for step in range(cfg.steps):
            last = step == cfg.steps - 1
            q_t, _ = self.query_read(run.s, run.q_enc, run.q_mask)                # (A, 2h)
            d_t, logits = self.doc_read(run.s, q_t, run.d_enc, run.d_mask)       # (A, 2h), (A, Ld)
            log_d = masked_log_softmax(_full_precision(logits), run.a_mask)      # log d_{i,t}: (A, Ld)
            h = run.spent.new_zeros(run.spent.shape)                             # no unit at T_max
            if not last:
                run.s = self._search(run.s, q_t, d_t)                            # s_t: (A, s)
                h = self.halting_unit(run.s, step)                               # h_t: (A,)
            p, halts = halting_weights(h, run.spent, last)                       # (A,), (A,)
            p, halts = torch.where(run.alive, p, torch.zeros_like(p)), halts & run.alive
            record.add(run.rows, step, h, p, halts, log_d)
            run.spent, run.alive = run.spent + h, run.alive & ~halts
            if last or not bool(run.alive.any()):
                break
            if not torch.is_grad_enabled():
                run = run.select(run.alive)
        return record.finish()


@dataclass
class _Running:
    """The rows of a batch that the ACT loop still computes, with their per-row state."""

    rows: torch.Tensor       # (A,) int64 indices into the batch
    alive: torch.Tensor      # (A,) bool: not halted yet
    spent: torch.Tensor      # (A,) Σ h_t so far
    s: torch.Tensor          # (A, s) inference state
    q_enc: torch.Tensor      # (A, Lq, 2h)
    q_mask: torch.Tensor     # (A, Lq)
    d_enc: Memory            # (A, Ld, 2h)
    d_mask: torch.Tensor     # (A, Ld)
    a_mask: torch.Tensor     # (A, Ld) answer positions

    @classmethod
    def start(cls, q_enc: torch.Tensor, d_enc: Memory, batch: ReaderInputs, a_mask: torch.Tensor,
              state_dim: int) -> "_Running":
        n = q_enc.shape[0]
        return cls(torch.arange(n, device=q_enc.device), torch.ones(n, dtype=torch.bool, device=q_enc.device),
                   q_enc.new_zeros(n), q_enc.new_zeros(n, state_dim), q_enc, batch.query_mask, d_enc,
                   batch.doc_mask, a_mask)

    def select(self, keep: torch.Tensor) -> "_Running":
        """Only the rows where ``keep`` (inference: no gradient flows through the copies)."""
        return _Running(self.rows[keep], self.alive[keep], self.spent[keep], self.s[keep], self.q_enc[keep],
                        self.q_mask[keep], Memory(self.d_enc.tensor[keep], deferred=False), self.d_mask[keep],
                        self.a_mask[keep])


class _HaltingRecord:
    """Per-step results of the ACT loop, gathered back to full batch size."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.h: list[torch.Tensor] = []          # (B,) each
        self.p: list[torch.Tensor] = []          # (B,)
        self.log_d: list[torch.Tensor] = []      # (B, Ld)
        self.steps: torch.Tensor | None = None   # (B,) int64
        self.remainder: torch.Tensor | None = None

    def _full(self, rows: torch.Tensor, x: torch.Tensor, fill: float) -> torch.Tensor:
        if x.shape[0] == self.batch_size:
            return x
        return x.new_full((self.batch_size, *x.shape[1:]), fill).index_copy(0, rows, x)

    def add(self, rows, step: int, h, p, halts, log_d) -> None:
        if self.steps is None:
            self.steps = torch.zeros(self.batch_size, dtype=torch.long, device=p.device)
            self.remainder = p.new_zeros(self.batch_size)
        self.h.append(self._full(rows, h, 0.0))
        self.p.append(self._full(rows, p, 0.0))
        self.log_d.append(self._full(rows, log_d, float("-inf")))
        stopped = rows[halts]
        self.steps = self.steps.index_fill(0, stopped, step + 1)
        self.remainder = self.remainder.index_put((stopped,), p[halts])

    def finish(self) -> tuple[torch.Tensor, Halting]:
        p = torch.stack(self.p)                                                 # (n, B)
        log_att = mixture_log(safe_log(p), torch.stack(self.log_d))             # (B, Ld)
        return log_att, Halting(torch.stack(self.h, 1), p.t(), self.steps, self.remainder)


class ASReader(nn.Module):
    """Attention Sum Reader (Kadlec et al. 2016): one attention step, same code paths.

    The query is [forward state at its last token, backward state at its first token];
    d_i = softmax_i(d̃_i · q), then the same pointer-sum.
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoders = _Encoders(cfg)
        init_reader_(self)

    @property
    def embedding(self) -> nn.Embedding:
        return self.encoders.embedding

    def forward(self, batch: ReaderInputs) -> torch.Tensor:
        """Returns log P(a | Q, D): (B, C), -inf for candidates absent from the document."""
        _, query, d_enc = self.encoders(batch)                             # (B, 2h), (B, Ld, 2h)
        query, d_enc = self.encoders.drop(query), self.encoders.drop(d_enc)
        logits = _full_precision(bilinear_logits(d_enc, query))            # (B, Ld)
        log_att = masked_log_softmax(logits, _answer_mask(self.cfg, batch))
        return pointer_sum(log_att, batch.doc_cand, batch.cand_mask.shape[1])  # (B, C)


def build_reader(cfg: ReaderConfig) -> nn.Module:
    """The reader named by ``cfg.kind``; ``reader(batch) -> log_p`` (B, C).

    ``reader.embedding`` is the word embedding, for the L2 regulariser.
    """
    if cfg.vocab_size < 1:
        raise ValueError("cfg.vocab_size must be set (from the prepared vocabulary) before building")
    return ASReader(cfg) if cfg.kind == "as-reader" else IAAReader(cfg)
