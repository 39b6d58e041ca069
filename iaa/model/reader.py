"""The readers: the IAA reader, its fixed-query ablation and the AS Reader baseline.

All three share the embedding, the encoders, the masking and the pointer-sum, and map a batch
(``ReaderInputs``, e.g. the loader's ``Batch``) to log P(a | Q, D) for each candidate: (B, C).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from iaa.model.attention import DocRead, FixedQueryRead, Memory, QueryRead, bilinear_logits
from iaa.model.config import ReaderConfig
from iaa.model.dropout import Dropout
from iaa.model.encoder import BiGRUEncoder
from iaa.model.gates import SearchGate, gate_features
from iaa.model.halting import HaltingRecord, HaltingUnit, Running, halting_weights
from iaa.model.initialization import init_reader_
from iaa.model.inputs import ReaderInputs
from iaa.model.masking import full_precision, masked_log_softmax
from iaa.model.pointer import pointer_sum
from iaa.model import inference_steps, precision
from iaa.model.precision import cpu_bf16, gru_cell, small_matmuls


class _Encoders(nn.Module):
    """Shared word embedding X (|V| x d) and separate BiGRU encoders for query and document.

    Dropout (paper, "Training Details") is applied to the input embeddings and to the encodings,
    which are the inputs of the attention mechanisms; one mask per tensor, reused by all T steps.

    In inference on the fused CPU path, the document encoder reads a cached table of every word's
    input projection (``inference_table``, V x 6h numbers: 154 MB in fp32 at the paper config,
    77 MB in bf16), rebuilt whenever the embedding or the encoder's weights change (e.g. after
    each training step) or the precision does.
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._table: tuple[tuple, torch.Tensor] | None = None             # inference cache
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embed_dim, sparse=cfg.sparse_embedding_grad)
        self.drop = Dropout(cfg.dropout, fast=cfg.fast_dropout)
        self.query_encoder = BiGRUEncoder(cfg.embed_dim, cfg.hidden_dim, fused=cfg.fused_gru)
        self.doc_encoder = BiGRUEncoder(cfg.embed_dim, cfg.hidden_dim, fused=cfg.fused_gru)

    def forward(self, batch: ReaderInputs):
        """Returns q̃ (B, Lq, 2h), the query's final states (B, 2h) and d̃ (B, Ld, 2h), before
        the attention-input dropout (each reader drops what its attention reads)."""
        if self._use_table(batch.doc):
            q_emb = self.embed(batch.query)                                # (B, Lq, d)
            q_enc, q_final = self.query_encoder(q_emb, batch.query_mask, getattr(batch, "query_lengths", None))
            d_enc, _ = self.doc_encoder.forward_from_table(batch.doc, batch.doc_mask, self._doc_table())
            return q_enc, q_final, d_enc
        if self.training:
            self._table = None                                             # stale from here on
        q_emb, d_emb = self.embed(batch.query, batch.doc)                  # (B, Lq, d), (B, Ld, d)
        q_enc, q_final = self.query_encoder(self.drop(q_emb), batch.query_mask,
                                            getattr(batch, "query_lengths", None))  # (B, Lq, 2h), (B, 2h)
        d_emb = self.drop(d_emb)
        d_enc, _ = self.doc_encoder(d_emb, batch.doc_mask,
                                    getattr(batch, "doc_lengths", None))   # (B, Ld, 2h)  eq. 1
        return q_enc, q_final, d_enc

    def embed(self, *tokens: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The word vectors of each of ``tokens``: (B, L) -> (B, L, d); several token tensors are
        looked up together, so the embedding gets one gradient rather than a sum of several.

        The gradient is sparse (``sparse_embedding_grad``) on the CPU only, where
        ``iaa.jobs.training.step`` turns it into an exact, cheap Adam update. On a GPU it is dense: a
        sparse gradient must be coalesced, which reads its size back to the host every step.
        One lookup for query and document saves adding two sparse gradients of the whole
        vocabulary's shape every step.
        """
        weight = self.embedding.weight
        sparse = self.embedding.sparse and tokens[0].is_cpu
        if len(tokens) == 1:
            return F.embedding(tokens[0], weight, sparse=sparse)
        vectors = F.embedding(torch.cat([t.reshape(-1) for t in tokens]), weight, sparse=sparse)
        return tuple(v.view(*t.shape, -1) for v, t in zip(vectors.split([t.numel() for t in tokens]), tokens))

    def _use_table(self, doc: torch.Tensor) -> bool:
        """Inference (no dropout, no gradient) on the fused CPU path: look the document's input
        projections up per word instead of computing them per token (same values)."""
        return (self.cfg.inference_table and self.cfg.fused_gru and doc.is_cpu
                and not self.training and not torch.is_grad_enabled())

    def _doc_table(self) -> torch.Tensor:
        """The doc encoder's per-word projections (2, V, 3h), rebuilt when any weight changed;
        in bf16 under CPU autocast with bf16 (as the fused encoder's projections), else fp32."""
        dtype = torch.bfloat16 if cpu_bf16() else None                    # None: the embedding's
        params = [self.embedding.weight, *self.doc_encoder.gru._flat_weights]
        key = (dtype, *((p.data_ptr(), p._version) for p in params))
        if self._table is None or self._table[0] != key:
            self._table = None                                             # free the old one first
            self._table = (key, self.doc_encoder.input_table(self.embedding.weight, dtype))
        return self._table[1]


def _small_matmuls():
    """The attention steps' 32-row matmuls (gates, inference GRU, query reads, the projections
    of the document reads) under bf16: in training bf16 operands on AMX where the CPU has it
    (else fp32: autocast's per-call casts cost more than bf16 saves at 32 rows), in inference
    bf16 operands with bf16 weights made once per pass (``precision.small_matmuls``;
    docs/speed.md, "bf16 on CPU"). The document reads keep their ``Memory``'s dtype (bf16 under
    bf16 autocast); the log-softmaxes and the pointer-sum are fp32 either way."""
    bf16, grad = cpu_bf16(), torch.is_grad_enabled()
    return small_matmuls(bf16 and not grad, amx=bf16 and grad)


def _answer_mask(cfg: ReaderConfig, batch: ReaderInputs) -> torch.Tensor:
    """Positions the answer distribution d_{i,T} ranges over: all real tokens (paper), or only
    candidate positions (Stanford AR / GA Reader, ``candidate_softmax``)."""
    if cfg.candidate_softmax:
        return batch.doc_mask & (batch.doc_cand >= 0)
    return batch.doc_mask


class _Reader(nn.Module):
    """What the readers share: the encoders, then ``_read`` from the encodings to log P(a | Q, D).

    ``compile_reads`` compiles ``_read`` (the attention steps and the answer distribution, where
    the per-step work is small and a step launches dozens of kernels) with ``torch.compile``;
    training steps then run the compiled reads, everything else the eager ones.
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoders = _Encoders(cfg)
        self._compiled_read = None

    @property
    def embedding(self) -> nn.Embedding:
        return self.encoders.embedding

    def forward(self, batch: ReaderInputs) -> torch.Tensor:
        """Returns log P(a | Q, D): (B, C), -inf for candidates absent from the document."""
        q_enc, q_final, d_enc = self.encoders(batch)                      # (B, Lq, 2h), (B, 2h), (B, Ld, 2h)
        compiled = self._compiled_read is not None and self.training and torch.is_grad_enabled()
        read = self._compiled_read if compiled else self._read
        return read(q_enc, q_final, d_enc, batch.query_mask, batch.doc_mask, _answer_mask(self.cfg, batch),
                    batch.doc_cand, batch.cand_mask.shape[1])

    def compile_reads(self, mode: str | None = None, backend: str = "inductor") -> None:
        """Compile ``_read`` for training steps (``mode``, ``backend``: ``torch.compile``'s;
        ``reduce-overhead`` means CUDA graphs on CUDA).

        The first shape compiles a static graph and the next one a graph with dynamic sizes
        (torch's automatic dynamic shapes), which serves every later shape. CUDA graphs are
        recorded per shape, so callers pad Lq and Ld to a few widths
        (``iaa.data.batch.pad_to_buckets``). Inside the compiled graph the document reads are
        plain ``bmm`` under autograd (the deferred gradient of ``Memory`` keeps Python state that
        a graph cannot hold).
        """
        mode = mode if backend == "inductor" else None                   # modes are inductor's
        self._compiled_read = torch.compile(self._read, mode=mode, backend=backend)

    def _read(self, q_enc: torch.Tensor, q_final: torch.Tensor, d_enc: torch.Tensor, query_mask: torch.Tensor,
              doc_mask: torch.Tensor, answer_mask: torch.Tensor, doc_cand: torch.Tensor,
              num_cands: int) -> torch.Tensor:
        raise NotImplementedError


class IAAReader(_Reader):
    """Iterative Alternating Attention reader (paper section 3); ``iaa-fixed-query`` too.

    s_0 = 0. The paper does not give s_0. A zero state adds no parameters and makes the first
    query read softmax_i(q̃_iᵀ a_q): the learned, query-independent importance bias that the
    paper introduces a_q for, over encodings that already carry the whole query's context. A
    learned s_0 would only shift a_q by the constant A_q s_0; a projection of the query encoding
    would add a layer that the paper does not describe.

    The last step computes only the document attention d_{i,T}: s_T is never read, so its gates
    and GRU update would be dead computation.

    In CPU inference the T steps run as one C++ call (``iaa.model.inference_steps``), which
    computes the same steps with each read's logits, softmax and glimpse fused.

    With ``cfg.halting == "act"`` each example takes 1 to T steps (Adaptive Computation Time,
    ``iaa.model.halting``) and the answer distribution mixes the steps' document attentions.
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__(cfg)
        two_h, s = 2 * cfg.hidden_dim, cfg.state_dim
        self.query_read = FixedQueryRead() if cfg.kind == "iaa-fixed-query" else QueryRead(s, two_h)
        self.doc_read = DocRead(s, two_h)
        self.gate_q = SearchGate(s + 3 * two_h, cfg.gate_dim, two_h)
        self.gate_d = SearchGate(s + 3 * two_h, cfg.gate_dim, two_h)
        self.search = nn.GRUCell(2 * two_h, s)                           # inference GRU
        self._step_weights = inference_steps.StepWeights()
        self.halting_unit = HaltingUnit(s, cfg.steps) if cfg.halting == "act" else None
        init_reader_(self)
        if self.halting_unit is not None:
            nn.init.constant_(self.halting_unit.bias, cfg.halt_bias_init)

    def forward(self, batch: ReaderInputs, return_halting: bool = False):
        """Returns log P(a | Q, D): (B, C), -inf for candidates absent from the document; with
        ``return_halting``, also what ACT decided (a ``Halting``; None when ``halting="none"``)."""
        if self.training:
            self._step_weights.reset()                                     # weights about to change
        if self.halting_unit is None:
            log_p = super().forward(batch)
            return (log_p, None) if return_halting else log_p
        q_enc, _, d_enc = self.encoders(batch)                             # (B, Lq, 2h), (B, Ld, 2h)
        log_p, halting = self._adaptive_read(q_enc, d_enc, batch)
        return (log_p, halting) if return_halting else log_p

    def _read(self, q_enc, q_final, d_enc, query_mask, doc_mask, answer_mask, doc_cand, num_cands):
        """The T alternating steps and the pointer-sum: (B, C)."""
        if inference_steps.usable(self, q_enc):
            bf16 = cpu_bf16()
            logits = inference_steps.logits(self, self._step_weights, q_enc, d_enc, query_mask, doc_mask,
                                            bf16, bf16 and precision.BF16_SMALL_MATMULS)
            return pointer_sum(masked_log_softmax(logits, answer_mask), doc_cand, num_cands)
        deferred = self.cfg.batched_read_grad and not torch.compiler.is_compiling()
        q_enc = full_precision(self.encoders.drop(q_enc))                  # attention inputs, fp32
        d_enc = Memory(full_precision(self.encoders.drop(d_enc)), deferred=deferred)  # bf16 reads under bf16
        s = q_enc.new_zeros(q_enc.shape[0], self.cfg.state_dim)            # s_0: (B, s)
        with _small_matmuls():
            for step in range(self.cfg.steps):
                q_t, _ = self.query_read(s, q_enc, query_mask)             # (B, 2h)
                if step == self.cfg.steps - 1:
                    logits = self.doc_read.logits(s, q_t, d_enc)           # (B, Ld)
                    break
                d_t, _ = self.doc_read(s, q_t, d_enc, doc_mask)            # (B, 2h)
                s = self._search(s, q_t, d_t)                              # s_t: (B, s)
        log_att = masked_log_softmax(logits, answer_mask)                  # log d_{i,T}, fp32
        return pointer_sum(log_att, doc_cand, num_cands)                   # (B, C) eq. 2

    def _search(self, s: torch.Tensor, q_t: torch.Tensor, d_t: torch.Tensor) -> torch.Tensor:
        """Gated search results into the inference GRU: s_{t-1} -> s_t, (B, s)."""
        features = self.encoders.drop(gate_features(s, q_t, d_t))          # (B, s + 6h)
        r_q, r_d = self.gate_q(features), self.gate_d(features)            # (B, 2h) each
        return gru_cell(torch.cat([r_q * q_t, r_d * d_t], -1), s, self.search)

    def _adaptive_read(self, q_enc: torch.Tensor, d_enc: torch.Tensor, batch: ReaderInputs):
        """ACT over the steps (``iaa.model.halting``): log P(a | Q, D) (B, C) from the mixture
        Σ_t p_t d_{i,t}, and the ``Halting``.

        Under ``torch.no_grad`` (inference) an example that halts leaves the batch, so later steps
        compute only the examples still running; in training they run on with weight 0, and the
        loop ends when the last example has halted. Always eager (``compile_reads`` compiles the
        fixed-T read only).
        """
        cfg = self.cfg
        q_enc = full_precision(self.encoders.drop(q_enc))                  # attention inputs, fp32
        d_enc = Memory(full_precision(self.encoders.drop(d_enc)), deferred=cfg.batched_read_grad)
        with _small_matmuls():
            return self._act_steps(q_enc, d_enc, batch)

    def _act_steps(self, q_enc: torch.Tensor, d_enc: Memory, batch: ReaderInputs):
        cfg = self.cfg
        run = Running.start(q_enc, d_enc, batch.query_mask, batch.doc_mask, _answer_mask(cfg, batch), cfg.state_dim)
        record = HaltingRecord(q_enc.shape[0])
        for step in range(cfg.steps):
            last = step == cfg.steps - 1
            q_t, _ = self.query_read(run.s, run.q_enc, run.q_mask)                # (A, 2h)
            d_t, logits = self.doc_read(run.s, q_t, run.d_enc, run.d_mask)       # (A, 2h), (A, Ld)
            log_d = masked_log_softmax(logits, run.a_mask)                       # log d_{i,t}: (A, Ld)
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
        log_att, halting = record.finish()                                 # log Σ_t p_t d_{i,t}: (B, Ld)
        return pointer_sum(log_att, batch.doc_cand, batch.cand_mask.shape[1]), halting  # (B, C) eq. 2


class ASReader(_Reader):
    """Attention Sum Reader (Kadlec et al. 2016): one attention step, same code paths.

    The query is [forward state at its last token, backward state at its first token];
    d_i = softmax_i(d̃_i · q), then the same pointer-sum.
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__(cfg)
        init_reader_(self)

    def _read(self, q_enc, q_final, d_enc, query_mask, doc_mask, answer_mask, doc_cand, num_cands):
        """One dot-product read with the query's final states, and the pointer-sum: (B, C)."""
        query, d_enc = self.encoders.drop(q_final), self.encoders.drop(d_enc)   # (B, 2h), (B, Ld, 2h)
        log_att = masked_log_softmax(bilinear_logits(d_enc, query), answer_mask)  # (B, Ld), fp32
        return pointer_sum(log_att, doc_cand, num_cands)                   # (B, C)


def build_reader(cfg: ReaderConfig) -> nn.Module:
    """The reader named by ``cfg.kind``; ``reader(batch) -> log_p`` (B, C).

    ``reader.embedding`` is the word embedding, for the L2 regulariser.
    """
    if cfg.vocab_size < 1:
        raise ValueError("cfg.vocab_size must be set (from the prepared vocabulary) before building")
    return ASReader(cfg) if cfg.kind == "as-reader" else IAAReader(cfg)
