"""CNN-style questions (Hermann et al. 2015) from a tagged document.

Named entities are grouped by their normalised surface form (lowercased words) and each group is
replaced by one ``@entityN`` token. The query is a sentence that follows the document and mentions
at least one entity of the document; one such mention, drawn at random, becomes ``@placeholder``
and its ``@entityN`` is the answer. The document is the ``context`` sentences before the query
(30 by default: about the 760 tokens of a CNN article). As in the original, the entity numbers
are permuted at random per question, so that a model cannot learn a name's prior, and the other
words are lowercased. A window whose document holds fewer than two entities gives no question.
Windows start every ``stride`` sentences (default 8: about four queries per stretch of 31
sentences, as CNN has about four questions per article; neighbouring documents overlap).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Sequence

from iaa.data.cloze.tagging import NAME_LABELS, TaggedSentence

PLACEHOLDER = "@placeholder"
CONTEXT = 30
STRIDE = 8


@dataclass(frozen=True)
class CnnQuestion:
    position: int                      # index of the query sentence in the document
    context: tuple[str, ...]           # document tokens, entities as @entityN
    query: tuple[str, ...]             # with @placeholder
    answer: str                        # @entityN
    entities: tuple[tuple[str, str], ...]  # (@entityN, surface form), sorted by N


def mentions(s: TaggedSentence) -> list[tuple[int, int, str]]:
    """``(start, end, key)`` of each named entity of ``s``; the key is its normalised form."""
    return [(a, b, " ".join(s.words[a:b]).lower()) for a, b, label in s.ents if label in NAME_LABELS]


def questions(sentences: Sequence[TaggedSentence], rng: random.Random, *, context: int = CONTEXT,
              stride: int | None = None, tally: Counter[str] | None = None) -> Iterator[CnnQuestion]:
    """The questions of one document, in order. ``tally`` counts the ``windows`` tried and why each
    dropped one gave no question: ``too_few_entities`` (fewer than two in the document) or
    ``no_answer_in_context`` (the query sentence mentions none of the document's entities)."""
    tally = Counter() if tally is None else tally
    found = [mentions(s) for s in sentences]
    for q in range(context, len(sentences), stride or STRIDE):
        tally["windows"] += 1
        doc_keys = {key for k in range(q - context, q) for _, _, key in found[k]}
        slots = [m for m in found[q] if m[2] in doc_keys]
        if len(doc_keys) < 2 or not slots:
            tally["too_few_entities" if len(doc_keys) < 2 else "no_answer_in_context"] += 1
            continue
        chosen = rng.choice(slots)
        yield _anonymise(sentences, found, q, context, chosen, rng)


def _anonymise(sentences, found, q: int, context: int, chosen, rng: random.Random) -> CnnQuestion:
    surface: dict[str, str] = {}  # key -> first surface form, in order of first mention
    for k in range(q - context, q + 1):
        for a, b, key in found[k]:
            surface.setdefault(key, " ".join(sentences[k].words[a:b]))
    ids = dict(zip(surface, rng.sample(range(len(surface)), len(surface))))
    doc = [w for k in range(q - context, q) for w in _replace(sentences[k], found[k], ids)]
    query = _replace(sentences[q], found[q], ids, placeholder=chosen)
    entities = tuple(sorted(((f"@entity{n}", surface[key]) for key, n in ids.items()), key=lambda e: int(e[0][7:])))
    return CnnQuestion(q, tuple(doc), tuple(query), f"@entity{ids[chosen[2]]}", entities)


def _replace(s: TaggedSentence, spans, ids: dict[str, int], placeholder=None) -> list[str]:
    out, i = [], 0
    starts = {a: (b, key, (a, b, key) == placeholder) for a, b, key in spans}
    while i < len(s.words):
        if i in starts:
            end, key, is_gap = starts[i]
            out.append(PLACEHOLDER if is_gap else f"@entity{ids[key]}")
            i = end
        else:
            out.append(s.words[i].lower())
            i += 1
    return out
