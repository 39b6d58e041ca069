"""The records ``iaa-cli explain`` makes of each example it explains, read by its HTML page, its
PNG figure and its summary lines, and printed by ``--json``.

The fields are in the order of the JSON object (:func:`iaa.jobs.evaluation.result.plain` turns a
record into a dict of its fields, tuples as lists), so a field renamed here is renamed in the JSON:
programs parse that object, so a field may be added, never renamed or removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class ExplainedStep:
    """One inference step t of the reader's trace, values rounded to the record's decimals.

    Attributes:
        step: t, from 1.
        query_attention: q_{i,t} over the query's words; None where the reader has no query
            attention (``as-reader``: its final encoder states).
        doc_attention: d_{i,t} over the document's words.
        r_q, r_d: the search gates' means over their 2h units; None on the last step (no gates).
        halt_prob: ACT's halting probability h_t; None without halting (or on a step without a unit).
        weight: ACT's weight p_t of this step in the answer; None without halting.
    """

    step: int
    query_attention: tuple[float, ...] | None
    doc_attention: tuple[float, ...]
    r_q: float | None
    r_d: float | None
    halt_prob: float | None
    weight: float | None


@dataclass(frozen=True)
class ExplainedExample:
    """One explained example: its words, the reader's trace and its final distribution.

    Attributes:
        example_id: the example's id in its split or ``--input`` file.
        model: the reader's kind (``iaa``, ``iaa-fixed-query``, ``as-reader``).
        steps: how many steps the trace holds (T, or where ACT stopped).
        placeholder: the query's placeholder word.
        query_tokens, doc_tokens: the words, a document word that is a candidate spelled as the candidate.
        doc_cand: each document position's candidate index, -1 for none.
        candidates: the candidate words, in the order of ``probs``.
        gold: the answer's candidate index; None where the question gives none.
        pred: the candidate index of the largest probability.
        probs: P(a | Q, D) per candidate, at ``temperature``.
        temperature: the one the reader answers at (its checkpoint's).
        stopped_at: the step where ACT stopped; None without halting.
        max_steps: the reader's T.
        trace: one :class:`ExplainedStep` per step.
        unknown_share: the share of the document's words that are ``<unk>`` to the reader.
        unknown_candidates: the candidates that are ``<unk>`` to the reader.
        absent_candidates: the candidates no document word names (probability 0).
        entity_names: the real names of its candidates where the question gives them (a CNN
            question file, or an ``--input`` record's ``entities``: ``@entity0`` -> ``Ann Lee``);
            empty where it gives none (a prepared split keeps no names).
    """

    example_id: str
    model: str
    steps: int
    placeholder: str
    query_tokens: tuple[str, ...]
    doc_tokens: tuple[str, ...]
    doc_cand: tuple[int, ...]
    candidates: tuple[str, ...]
    gold: int | None
    pred: int
    probs: tuple[float, ...]
    temperature: float
    stopped_at: int | None
    max_steps: int
    trace: tuple[ExplainedStep, ...]
    unknown_share: float
    unknown_candidates: tuple[str, ...]
    absent_candidates: tuple[str, ...]
    entity_names: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_mistake(self) -> bool:
        """The reader's answer is not the gold one (False where the question gives none)."""
        return self.gold is not None and self.pred != self.gold

    def unknowns(self) -> dict[str, Any]:
        """``unknown_share`` and ``unknown_candidates`` in the shape :mod:`~iaa.jobs.evaluation.unknowns` reads."""
        return {"unknown_share": self.unknown_share, "unknown_candidates": list(self.unknown_candidates)}
