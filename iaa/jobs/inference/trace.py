"""What a trained reader looks at: per-step attentions and gate values of one example.

The trace drives the reader's own submodules (encoders, query and document reads, search gates,
inference GRU) in the order of its ``forward`` (paper section 3), in eval mode, and keeps what
``forward`` throws away: at each step t = 1..T the query attention q_{i,t} (B, Lq), the document
attention d_{i,t} (B, Ld) and the mean search-gate values r_q, r_d. Its final distribution is the
model's own ``forward`` output, and ``trace_batch`` checks that the replayed last step agrees.

An ACT reader (``model.halting="act"``) is replayed for the steps its examples took; each step
also carries the halting probability h_t, the trace the step N where each example stopped, and
its final distribution is the mixture Σ_t p_t d_{i,t} of the replayed steps.

The AS Reader has one step and no query attention (its query is the encoder's final states); the
fixed-query ablation has T steps of uniform query attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from iaa.data.batch import Batch
from iaa.model.attention import Memory, bilinear_logits
from iaa.model.gates import gate_features
from iaa.model.halting import Halting
from iaa.model.masking import masked_log_softmax, masked_softmax
from iaa.model.pointer import candidate_probs, pointer_sum
from iaa.model.reader import ASReader, _answer_mask

AGREE_ATOL = 1e-4  # replayed vs forward candidate probabilities (float32 CPU, same ops)


@dataclass(frozen=True)
class StepTrace:
    """One inference step of a batch. ``r_q``/``r_d`` are None where the step has no gates (the
    last step computes only d_{i,T}; the AS Reader has none); ``query`` is None without query
    attention (AS Reader)."""

    query: torch.Tensor | None   # (B, Lq) q_{i,t}
    doc: torch.Tensor            # (B, Ld) d_{i,t}
    r_q: torch.Tensor | None     # (B,) mean over the 2h gate units
    r_d: torch.Tensor | None     # (B,)
    halt: torch.Tensor | None = None    # (B,) h_t of an ACT reader; None without halting
    weight: torch.Tensor | None = None  # (B,) p_t, the step's share of the answer (ACT)


@dataclass(frozen=True)
class Trace:
    steps: list[StepTrace]
    probs: torch.Tensor          # (B, C) pointer-sums renormalised over the candidates
    stopped: torch.Tensor | None = None  # (B,) N, the step each example stopped at (ACT)


@torch.no_grad()
def trace_batch(model: nn.Module, batch: Batch) -> Trace:
    """Replay ``model`` on ``batch`` step by step (eval mode); raises if the replay disagrees
    with ``model(batch)``, which would mean the reader's ``forward`` changed shape."""
    model.eval()
    if getattr(model.cfg, "halting", "none") == "act":
        log_p, halting = model(batch, return_halting=True)                   # (B, C), Halting
        steps = _iaa_steps(model, batch, halting)
        answer = sum(step.weight[:, None] * step.doc for step in steps)     # Σ_t p_t d_{i,t}: (B, Ld)
    else:
        log_p, halting = model(batch), None
        steps = _as_reader_steps(model, batch) if isinstance(model, ASReader) else _iaa_steps(model, batch)
        answer = steps[-1].doc                                               # d_{i,T}
    probs = candidate_probs(log_p)                                           # (B, C)
    replay = candidate_probs(pointer_sum(torch.log(answer), batch.doc_cand, batch.cand_mask.shape[1]))
    if not torch.allclose(replay, probs, atol=AGREE_ATOL):
        raise RuntimeError("the replayed attention does not reproduce the reader's output: "
                           "iaa.jobs.inference.trace must follow the reader's forward")
    return Trace(steps, probs, None if halting is None else halting.steps)


def _iaa_steps(model: nn.Module, batch: Batch, halting: Halting | None = None) -> list[StepTrace]:
    """The fixed reader's T steps; with ``halting`` (ACT), the steps up to the last stop, each
    with its d_{i,t} over the answer positions, h_t and p_t."""
    cfg = model.cfg
    q_enc, _, d_enc = model.encoders(batch)                                  # (B, Lq, 2h), (B, Ld, 2h)
    memory = Memory(d_enc, deferred=False)
    answer_mask = _answer_mask(cfg, batch)
    s = q_enc.new_zeros(q_enc.shape[0], cfg.state_dim)                       # s_0: (B, s)
    last = cfg.steps - 1 if halting is None else int(halting.steps.max()) - 1
    out: list[StepTrace] = []
    for step in range(last + 1):
        q_t, q_att = model.query_read(s, q_enc, batch.query_mask)            # (B, 2h), (B, Lq)
        if step == cfg.steps - 1:
            logits = model.doc_read.logits(s, q_t, memory)                   # (B, Ld)
            d_att = masked_log_softmax(logits, answer_mask).exp()            # d_{i,T}
            out.append(_with_halting(StepTrace(q_att, d_att, None, None), halting, step))
            break
        d_t, logits = model.doc_read(s, q_t, memory, batch.doc_mask)        # (B, 2h), (B, Ld)
        features = gate_features(s, q_t, d_t)                                # (B, s + 6h)
        r_q, r_d = model.gate_q(features), model.gate_d(features)            # (B, 2h) each
        d_att = masked_softmax(logits, batch.doc_mask if halting is None else answer_mask)
        out.append(_with_halting(StepTrace(q_att, d_att, r_q.mean(1), r_d.mean(1)), halting, step))
        s = model.search(torch.cat([r_q * q_t, r_d * d_t], -1), s)           # s_t: (B, s)
    return out


def _with_halting(step: StepTrace, halting: Halting | None, t: int) -> StepTrace:
    if halting is None:
        return step
    return replace(step, halt=halting.probs[:, t], weight=halting.weights[:, t])


def _as_reader_steps(model: nn.Module, batch: Batch) -> list[StepTrace]:
    _, query, d_enc = model.encoders(batch)                                  # (B, 2h), (B, Ld, 2h)
    log_att = masked_log_softmax(bilinear_logits(d_enc, query), _answer_mask(model.cfg, batch))
    return [StepTrace(None, log_att.exp(), None, None)]                      # (B, Ld)
