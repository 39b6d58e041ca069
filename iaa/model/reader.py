"""The readers: the IAA reader, its fixed-query ablation and the AS Reader baseline.

All three share the embedding, the encoders, the masking and the pointer-sum, and map a batch
(``ReaderInputs``, e.g. the loader's ``Batch``) to log P(a | Q, D) for each candidate: (B, C).
This is the reference: plain PyTorch, each equation once. The fast paths of its parts
(``iaa.model.kernels``) are chosen when a reader is built, for its device and precision, and
handed to it as one plain function per slot (``slots``: tensors and weights in, tensors out),
None where no kernel serves. The reader runs its own equations and switches to a slot at one
site each: the encoder's BiGRU, the document encoder in inference (``table``), the dropout, the
document reads, the steps' layers and the T steps in inference (``steps``). Inside a graph that
``torch.compile`` traces (``compile_reads``) no slot runs: the compiler fuses the reference
itself. ``forward`` returns one ``ReaderOutput``.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable, ContextManager, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from iaa.model import kernels as fast
from iaa.model.attention import DocRead, Encodings, FixedQueryRead, Layers, QueryRead, bilinear_logits
from iaa.model.config import ReaderConfig
from iaa.model.encoder import BiGRUEncoder, arithmetic
from iaa.model.gates import SearchGate, gate_features
from iaa.model.halting import Halting, HaltingRecord, HaltingUnit, Running, halting_weights
from iaa.model.initialization import init_reader_
from iaa.model.inputs import ReaderInputs
from iaa.model.masking import full_precision, masked_log_softmax
from iaa.model.pointer import pointer_sum


@dataclass(frozen=True)
class StepTrace:
    """One step t of a batch, as ``forward(batch, trace=True)`` returns it."""

    query: torch.Tensor | None          # (B, Lq) q_{i,t}; None without query attention (AS Reader)
    doc: torch.Tensor                   # (B, Ld) d_{i,t}; at the last step, the answer distribution
    r_q: torch.Tensor | None            # (B, 2h) query gate; None where the step has none
    r_d: torch.Tensor | None            # (B, 2h) document gate
    halt: torch.Tensor | None = None    # (B,) h_t of an ACT reader (0 at T_max)
    weight: torch.Tensor | None = None  # (B,) p_t, the step's share of the answer (ACT)


@dataclass(frozen=True)
class Trace:
    """The steps a batch went through (ACT: up to the last example's stop), and ACT's decisions."""

    steps: list[StepTrace]
    halting: Halting | None = None


@dataclass(frozen=True)
class ReaderOutput:
    """What a reader's ``forward`` returns."""

    log_probs: torch.Tensor             # (B, C) log P(a | Q, D); -inf for candidates absent from the document
    trace: Trace | None = None          # with ``trace=True``: the steps' attentions, gates and ACT's halting
    halting: Halting | None = None      # what ACT decided (ponder terms); None without ACT


class Masks(NamedTuple):
    """Masks of a batch, True at real positions."""

    query: torch.Tensor   # (B, Lq)
    doc: torch.Tensor     # (B, Ld)
    answer: torch.Tensor  # (B, Ld) the positions the answer distribution ranges over

    @classmethod
    def of(cls, cfg: ReaderConfig, batch: ReaderInputs) -> "Masks":
        """All real tokens (paper), or only candidate positions (Stanford AR / GA Reader,
        ``candidate_softmax``), for the answer."""
        answer = batch.doc_mask & (batch.doc_cand >= 0) if cfg.candidate_softmax else batch.doc_mask
        return cls(batch.query_mask, batch.doc_mask, answer)


class _Step(NamedTuple):
    """What one alternating step computed."""

    q_att: torch.Tensor                 # (B, Lq) q_{i,t}
    logits: torch.Tensor                # (B, Ld) document logits
    d_att: torch.Tensor | None = None   # (B, Ld) d_{i,t} over the real tokens; None at the last step
    r_q: torch.Tensor | None = None     # (B, 2h)
    r_d: torch.Tensor | None = None     # (B, 2h)
    s: torch.Tensor | None = None       # (B, s) s_t


class _Encoders(nn.Module):
    """Shared word embedding X (|V| x d) and separate BiGRU encoders for query and document."""

    def __init__(self, cfg: ReaderConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embed_dim, sparse=cfg.sparse_embedding_grad)
        self.query_encoder = BiGRUEncoder(cfg.embed_dim, cfg.hidden_dim)
        self.doc_encoder = BiGRUEncoder(cfg.embed_dim, cfg.hidden_dim)

    def embed(self, *tokens: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The word vectors of each of ``tokens``: (B, L) -> (B, L, d); several token tensors are
        looked up together, so the embedding gets one gradient rather than a sum of several.

        The gradient is sparse (``sparse_embedding_grad``) on the CPU only, where
        ``iaa.jobs.training.step`` turns it into an exact, cheap Adam update. On a GPU it is
        dense: a sparse gradient must be coalesced, which reads its size back to the host every
        step. One lookup for query and document saves adding two sparse gradients of the whole
        vocabulary's shape every step.
        """
        weight = self.embedding.weight
        sparse = self.embedding.sparse and tokens[0].is_cpu
        if len(tokens) == 1:
            return F.embedding(tokens[0], weight, sparse=sparse)
        vectors = F.embedding(torch.cat([t.reshape(-1) for t in tokens]), weight, sparse=sparse)
        return tuple(v.view(*t.shape, -1) for v, t in zip(vectors.split([t.numel() for t in tokens]), tokens))


_NO_SLOTS = fast.Slots()                 # every slot runs the reference


class _Reader(nn.Module):
    """What the readers share: the encoders, then ``_read`` from the encodings to the answer
    distribution, then the pointer-sum.

    Args:
        cfg: the reader's hyperparameters.
        device: where it will run (cpu, cuda): the fast paths are chosen for it. A reader moved
            to another device type (``.to``) chooses again.
        precision: fp32 or bf16 (bf16 operands where the kernels or autocast give them; the
            softmaxes, the pointer-sum and every parameter stay fp32).
    """

    def __init__(self, cfg: ReaderConfig, device: str | torch.device = "cpu", precision: str = "fp32") -> None:
        super().__init__()
        self.cfg, self.precision = cfg, precision
        self.encoders = _Encoders(cfg)
        self.kernels = fast.select(device, precision, cfg)
        self._reads = type(self)._read                                   # or compiled: ``compile_reads``

    @property
    def embedding(self) -> nn.Embedding:
        return self.encoders.embedding

    @property
    def kernels(self) -> fast.Kernels:
        """The kernels chosen for this reader (``iaa.model.kernels.select``); setting them binds
        ``slots`` again."""
        return self._kernels

    @kernels.setter
    def kernels(self, kernels: fast.Kernels) -> None:
        self._kernels = kernels
        self.slots = kernels.slots()

    def forward(self, batch: ReaderInputs, trace: bool = False) -> ReaderOutput:
        """log P(a | Q, D) (B, C), -inf for candidates absent from the document; with ``trace``,
        the ``Trace`` of its steps (attentions, gates, ACT's halting); ACT's ``Halting``."""
        if self.training:
            self.kernels.forget()            # an optimiser may have changed the weights in place
        with arithmetic(self.kernels.device, self.precision):
            q_enc, q_final, d_enc = self._encode(batch)                 # (B, Lq, 2h), (B, 2h), (B, Ld, 2h)
            masks = Masks.of(self.cfg, batch)
            log_att, steps, halting = self._reads(self, q_enc, q_final, d_enc, masks, trace)  # (B, Ld)
            log_p = pointer_sum(log_att, batch.doc_cand, batch.cand_mask.shape[1])  # (B, C) eq. 2
        return ReaderOutput(log_p, Trace(steps, halting) if trace else None, halting)

    def _encode(self, batch: ReaderInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q̃ (B, Lq, 2h), the query's final states (B, 2h) and d̃ (B, Ld, 2h) (eq. 1), after the
        input dropout and before the attention-input dropout (each reader drops what its
        attention reads). In inference the table slot encodes the document."""
        enc, slots = self.encoders, self._active_slots
        q_lengths, d_lengths = getattr(batch, "query_lengths", None), getattr(batch, "doc_lengths", None)
        if slots.table is not None and self._inference():                 # the document from its table
            q_enc, q_final = enc.query_encoder(enc.embed(batch.query), batch.query_mask, q_lengths,
                                               self.precision, slots.encoder)      # (B, Lq, 2h), (B, 2h)
            d_enc = slots.table(batch.doc, batch.doc_mask.sum(1), enc.embedding.weight,
                                enc.doc_encoder.gru)                               # (B, Ld, 2h)
            return q_enc, q_final, d_enc
        q_emb, d_emb = enc.embed(batch.query, batch.doc)                          # (B, Lq, d), (B, Ld, d)
        q_enc, q_final = enc.query_encoder(self._drop(q_emb), batch.query_mask, q_lengths, self.precision,
                                           slots.encoder)                          # (B, Lq, 2h), (B, 2h)
        d_enc, _ = enc.doc_encoder(self._drop(d_emb), batch.doc_mask, d_lengths, self.precision,
                                   slots.encoder)                                  # (B, Ld, 2h)
        return q_enc, q_final, d_enc

    @property
    def _active_slots(self) -> fast.Slots:
        """The slots that run: none inside a graph that ``torch.compile`` traces
        (``compile_reads``), where the compiler fuses the reference itself."""
        return _NO_SLOTS if torch.compiler.is_compiling() else self.slots

    def _inference(self) -> bool:
        """Eval mode without gradients: where the inference-only slots (``table``, ``steps``) may run."""
        return not (self.training or torch.is_grad_enabled())

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout (paper, "Training Details") on the input embeddings, the attention inputs and
        the search gates' inputs, with a fresh mask at every call: the attention inputs (q̃, d̃) are
        dropped once per forward pass, so all T steps read them through one mask; the gates'
        inputs are dropped afresh at each step."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        drop = self._active_slots.dropout
        return drop(x, self.cfg.dropout) if drop is not None else F.dropout(x, self.cfg.dropout, training=True)

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module``'s, then the kernels chosen again where the reader moved to another device
        type. A private torch method (``.to()``, ``.cuda()`` and ``.cpu()`` all run it): listed in
        ``kernels/kernel_internals.py``'s ``NAMES``, which a test checks against the installed torch."""
        super()._apply(fn, recurse)
        device = self.embedding.weight.device.type
        if device != self.kernels.device:
            self.kernels = fast.select(device, self.precision, self.cfg)
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> _Reader:
        """A copy with weights of its own (``copy.deepcopy``, as ``AveragedModel`` makes one) and
        kernels chosen afresh for it: kernels hold compiled code, shared and never copied, and
        caches of this reader's weights. A copy's reads are eager: ``compile_reads`` it again."""
        fresh = fast.select(self.kernels.device, self.precision, self.cfg)
        memo[id(self._kernels)], memo[id(self.slots)] = fresh, fresh.slots()
        memo[id(self._reads)] = type(self)._read
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        twin.__setstate__(copy.deepcopy(self.__dict__, memo))
        return twin

    def compile_reads(self, mode: str | None = None, backend: str = "inductor") -> None:
        """Compile ``_read`` for training steps (``mode``, ``backend``: ``torch.compile``'s;
        ``reduce-overhead`` means CUDA graphs on CUDA).

        The first shape compiles a static graph and the next one a graph with dynamic sizes
        (torch's automatic dynamic shapes), which serves every later shape. CUDA graphs are
        recorded per shape, so callers pad Lq and Ld to a few widths
        (``iaa.data.loading.batch.pad_to_buckets``). The compiled reads are the reference ones (no slot
        runs inside the graph: the compiler fuses them itself); ACT's steps stay eager.
        """
        if self.cfg.halting != "none":
            return
        mode = mode if backend == "inductor" else None                   # modes are inductor's
        compiled = torch.compile(partial(self._read, trace=False), mode=mode, backend=backend)
        self._reads = CompiledReads(compiled, type(self)._read)

    def _read(self, q_enc: torch.Tensor, q_final: torch.Tensor, d_enc: torch.Tensor, masks: Masks,
              trace: bool) -> tuple[torch.Tensor, list[StepTrace] | None, Halting | None]:
        """log d_{i,T} (B, Ld) over the answer positions, the steps' trace (with ``trace``) and
        ACT's ``Halting`` (None without ACT)."""
        raise NotImplementedError


@dataclass(frozen=True)
class CompiledReads:
    """A reader's reads: ``compiled`` (the reference reads, compiled) for training steps with
    gradients and no trace, ``eager`` otherwise."""

    compiled: Callable
    eager: Callable

    def __call__(self, reader: _Reader, q_enc, q_final, d_enc, masks: Masks, trace: bool):
        if reader.training and torch.is_grad_enabled() and not trace:
            return self.compiled(q_enc, q_final, d_enc, masks)
        return self.eager(reader, q_enc, q_final, d_enc, masks, trace)


class IAAReader(_Reader):
    """Iterative Alternating Attention reader (paper section 3); ``iaa-fixed-query`` too.

    s_0 = 0. The paper does not give s_0. A zero state adds no parameters and makes the first
    query read softmax_i(q̃_iᵀ a_q): the learned, query-independent importance bias that the
    paper introduces a_q for, over encodings that already carry the whole query's context. A
    learned s_0 would only shift a_q by the constant A_q s_0; a projection of the query encoding
    would add a layer that the paper does not describe.

    The last step computes only the document attention d_{i,T}: s_T is never read, so its gates
    and GRU update would be dead computation.

    With ``cfg.halting == "act"`` each example takes 1 to T steps (Adaptive Computation Time,
    ``iaa.model.halting``) and the answer distribution mixes the steps' document attentions;
    both loops run the same ``_step``.
    """

    def __init__(self, cfg: ReaderConfig, device: str | torch.device = "cpu", precision: str = "fp32") -> None:
        super().__init__(cfg, device, precision)
        two_h, s = 2 * cfg.hidden_dim, cfg.state_dim
        self.query_read = FixedQueryRead() if cfg.kind == "iaa-fixed-query" else QueryRead(s, two_h)
        self.doc_read = DocRead(s, two_h)
        self.gate_q = SearchGate(s + 3 * two_h, cfg.gate_dim, two_h)
        self.gate_d = SearchGate(s + 3 * two_h, cfg.gate_dim, two_h)
        self.search = nn.GRUCell(2 * two_h, s)                           # inference GRU
        self.halting_unit = HaltingUnit(s, cfg.steps) if cfg.halting == "act" else None
        init_reader_(self)
        if self.halting_unit is not None:
            nn.init.constant_(self.halting_unit.bias, cfg.halt_bias_init)

    def _step(self, s: torch.Tensor, q: torch.Tensor, d: Encodings, q_mask: torch.Tensor, d_mask: torch.Tensor,
              layers: Layers, last: bool) -> _Step:
        """One alternating step from s_{t-1} (B, s): the query read, the document read and,
        except at the last step, the gated search results into the inference GRU."""
        q_t, q_att = self.query_read(s, q, q_mask, layers)                       # (B, 2h), (B, Lq)
        if last:
            return _Step(q_att, self.doc_read.logits(s, q_t, d, layers))         # logits (B, Ld)
        d_t, d_att, logits = self.doc_read(s, q_t, d, d_mask, layers)           # (B, 2h), (B, Ld), (B, Ld)
        features = self._drop(gate_features(s, q_t, d_t))                        # (B, s + 6h)
        r_q, r_d = self.gate_q(features, layers), self.gate_d(features, layers)  # (B, 2h) each
        s = layers.gru_cell(torch.cat([r_q * q_t, r_d * d_t], -1), s, self.search)  # s_t: (B, s)
        return _Step(q_att, logits, d_att, r_q, r_d, s)

    def _attention_inputs(self, q_enc: torch.Tensor, d_enc: torch.Tensor) -> tuple[torch.Tensor, Encodings]:
        """q̃ (B, Lq, 2h) and the reads of d̃ (B, Ld, 2h) as the steps see them: after dropout,
        fp32 (the reads slot's document reads multiply in bf16 under bf16)."""
        q = full_precision(self._drop(q_enc))
        d = full_precision(self._drop(d_enc))
        reads = self._active_slots.reads
        return q, (reads(d) if reads is not None else Encodings(d))

    def _layers(self) -> ContextManager[Layers]:
        """How the steps apply their layers in one forward pass: each layer itself, or the layers
        slot's (gradients flowing or not)."""
        layers = self._active_slots.layers
        return layers(torch.is_grad_enabled()) if layers is not None else nullcontext(Layers)

    def _read(self, q_enc, q_final, d_enc, masks, trace):
        """The T alternating steps; in inference without a trace, the steps slot's; ACT's in
        ``_act_read``."""
        if self.halting_unit is not None:
            return self._act_read(q_enc, d_enc, masks, trace)
        fused = self._active_slots.steps
        if fused is not None and self._inference() and not trace:         # the T steps in one call
            logits, steps = fused(self._step_layers(), self.search, q_enc, d_enc, masks.query, masks.doc,
                                  self.cfg.steps), None                   # (B, Ld)
        else:
            logits, steps = self._steps(q_enc, d_enc, masks, trace)        # (B, Ld)
        log_att = masked_log_softmax(logits, masks.answer)                 # log d_{i,T}: (B, Ld), fp32
        if not trace:
            return log_att, None, None
        traced = [StepTrace(st.q_att, st.d_att, st.r_q, st.r_d) for st in steps[:-1]]
        return log_att, traced + [StepTrace(steps[-1].q_att, log_att.exp(), None, None)], None

    def _steps(self, q_enc, d_enc, masks, trace):
        """The T steps: the last step's document logits (B, Ld) and, with ``trace``, every
        step's ``_Step``."""
        q, d = self._attention_inputs(q_enc, d_enc)
        s = q.new_zeros(q.shape[0], self.cfg.state_dim)                    # s_0: (B, s)
        steps = []
        with self._layers() as layers:
            for t in range(self.cfg.steps):
                step = self._step(s, q, d, masks.query, masks.doc, layers, last=t == self.cfg.steps - 1)
                s = step.s
                if trace:
                    steps.append(step)
        return step.logits, (steps if trace else None)

    def _step_layers(self) -> list[nn.Linear]:
        """The steps' linear layers as the steps slot takes them: A_q, A_d, then the two layers
        of g_q and of g_d."""
        return [self.query_read.proj, self.doc_read.proj, self.gate_q.hidden, self.gate_q.out,
                self.gate_d.hidden, self.gate_d.out]

    def _act_read(self, q_enc, d_enc, masks, trace):
        """ACT over the steps (``iaa.model.halting``): log Σ_t p_t d_{i,t} (B, Ld), and the
        ``Halting``.

        Under ``torch.no_grad`` (inference) an example that halts leaves the batch, so later steps
        compute only the examples still running; in training they run on with weight 0, and the
        loop ends when the last example has halted.
        """
        cfg = self.cfg
        q, d = self._attention_inputs(q_enc, d_enc)
        run = Running.start(q, d, masks.query, masks.doc, masks.answer, cfg.state_dim)
        record = HaltingRecord(q.shape[0], keep=trace)
        with self._layers() as layers:
            for t in range(cfg.steps):
                last = t == cfg.steps - 1
                step = self._step(run.s, run.q_enc, run.d_enc, run.q_mask, run.d_mask, layers, last)
                log_d = masked_log_softmax(step.logits, run.a_mask)              # log d_{i,t}: (A, Ld)
                h = run.spent.new_zeros(run.spent.shape) if last else self.halting_unit(step.s, t)  # h_t: (A,)
                p, halts = halting_weights(h, run.spent, last)                   # (A,), (A,)
                p, halts = torch.where(run.alive, p, torch.zeros_like(p)), halts & run.alive
                record.add(run.rows, t, h, p, halts, log_d, (step.q_att, step.r_q, step.r_d))
                run.spent, run.alive = run.spent + h, run.alive & ~halts
                if last or not bool(run.alive.any()):
                    break
                run.s = step.s                                                   # s_t: (A, s)
                if not torch.is_grad_enabled():
                    run = run.select(run.alive)
        log_att, halting = record.finish()                                 # log Σ_t p_t d_{i,t}: (B, Ld)
        if not trace:
            return log_att, None, halting
        return log_att, [StepTrace(q_att, log_d.exp(), r_q, r_d, h, p) for (q_att, r_q, r_d), log_d, h, p
                         in zip(record.kept, record.log_d, record.h, record.p)], halting


class ASReader(_Reader):
    """Attention Sum Reader (Kadlec et al. 2016): one attention step, same code paths.

    The query is [forward state at its last token, backward state at its first token];
    d_i = softmax_i(d̃_i · q), then the same pointer-sum.
    """

    def __init__(self, cfg: ReaderConfig, device: str | torch.device = "cpu", precision: str = "fp32") -> None:
        super().__init__(cfg, device, precision)
        init_reader_(self)

    def _read(self, q_enc, q_final, d_enc, masks, trace):
        """One dot-product read with the query's final states."""
        query, d_enc = self._drop(q_final), self._drop(d_enc)                  # (B, 2h), (B, Ld, 2h)
        log_att = masked_log_softmax(bilinear_logits(d_enc, query), masks.answer)  # (B, Ld), fp32
        return log_att, [StepTrace(None, log_att.exp(), None, None)] if trace else None, None


def build_reader(cfg: ReaderConfig, device: str | torch.device = "cpu", precision: str = "fp32") -> nn.Module:
    """The reader named by ``cfg.kind``, with the fast paths for ``device`` and ``precision``
    (fp32 | bf16); ``reader(batch).log_probs``: (B, C) (a ``ReaderOutput``). Its parameters are on the CPU: move it with
    ``.to(device)``.

    ``reader.embedding`` is the word embedding, for the L2 regulariser.
    """
    if cfg.vocab_size < 1:
        raise ValueError("cfg.vocab_size must be set (from the prepared vocabulary) before building")
    return (ASReader if cfg.kind == "as-reader" else IAAReader)(cfg, device, precision)
