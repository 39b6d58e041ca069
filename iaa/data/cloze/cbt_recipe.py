"""Children's Book Test questions (Hill et al. 2016) from a tagged document.

Each window of 21 consecutive sentences gives at most one question of the chosen word type:
sentences 1-20 are the context, and in sentence 21 one word of the type that also occurs in the
context is replaced by ``XXXXX``. The 10 candidates, sorted, are the answer and 9 distinct words
of the same type drawn from the context. When the context has fewer than 9 such words the window
gives no question, except for named entities, which (as in the official CBT) are completed with
common nouns of the context. Windows start every ``stride`` sentences (1: every window, as CBT).

Word types come from the tags: NE is a noun inside a named-entity span that names something;
CN any other noun; V a verb; P a preposition (Penn tag ``IN``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Sequence

from iaa.data.cloze.tagging import NAME_LABELS, TaggedSentence

PLACEHOLDER = "XXXXX"
CONTEXT = 20
CANDIDATES = 10
WORD_TYPES = ("NE", "CN", "V", "P")
NOUN_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})


@dataclass(frozen=True)
class CbtQuestion:
    context: tuple[str, ...]     # 20 sentences, words joined by spaces
    query: str                   # sentence 21 with XXXXX
    answer: str
    candidates: tuple[str, ...]  # 10, sorted, the answer among them


def word_types(s: TaggedSentence) -> list[str | None]:
    """The CBT word type of each word of ``s`` (None: none of the four)."""
    named = set()
    for start, end, label in s.ents:
        if label in NAME_LABELS:
            named.update(range(start, end))
    types: list[str | None] = []
    for i, (w, t) in enumerate(zip(s.words, s.tags)):
        if not _usable(w):
            types.append(None)
        elif t in NOUN_TAGS:
            types.append("NE" if i in named else "CN")
        elif t.startswith("VB"):
            types.append("V")
        elif t == "IN":
            types.append("P")
        else:
            types.append(None)
    return types


def questions(sentences: Sequence[TaggedSentence], word_type: str, rng: random.Random,
              stride: int = 1, tally: Counter[str] | None = None) -> Iterator[CbtQuestion]:
    """The questions of one document, in order. ``rng`` draws answers and distractors.

    ``tally`` counts the ``windows`` tried and why each dropped one gave no question:
    ``no_answer_in_context`` (the query sentence has no word of the type that the context also
    holds) or ``too_few_candidates`` (fewer than 9 other words of the type in the context)."""
    tally = Counter() if tally is None else tally
    if word_type not in WORD_TYPES:
        raise ValueError(f"word type must be one of {WORD_TYPES}, got {word_type!r}")
    typed = [(s.words, word_types(s)) for s in sentences]
    window = _Window()
    added = 0  # sentences [added - CONTEXT, added) are in the window
    for q in range(CONTEXT, len(typed), stride):
        for k in range(max(added, q - CONTEXT), q):
            window.add(*typed[k])
        for k in range(max(0, added - CONTEXT), min(added, q - CONTEXT)):
            window.remove(*typed[k])
        added = q
        tally["windows"] += 1
        question = _question(typed, q, window, word_type, rng, tally)
        if question is not None:
            yield question


def _question(typed, q: int, window: "_Window", word_type: str, rng: random.Random,
              tally: Counter[str]) -> CbtQuestion | None:
    words, types = typed[q]
    slots = [i for i, (w, t) in enumerate(zip(words, types)) if t == word_type and w in window.words]
    if not slots:
        tally["no_answer_in_context"] += 1
        return None
    slot = rng.choice(slots)
    answer = words[slot]
    pool = sorted(w for w in window.by_type[word_type] if w != answer)
    if len(pool) < CANDIDATES - 1 and word_type == "NE":
        extra = sorted(w for w in window.by_type["CN"] if w != answer and w not in pool)
        pool += rng.sample(extra, min(len(extra), CANDIDATES - 1 - len(pool)))
    if len(pool) < CANDIDATES - 1:
        tally["too_few_candidates"] += 1
        return None
    distractors = pool if len(pool) == CANDIDATES - 1 else rng.sample(pool, CANDIDATES - 1)
    query = " ".join(PLACEHOLDER if i == slot else w for i, w in enumerate(words))
    context = tuple(" ".join(typed[k][0]) for k in range(q - CONTEXT, q))
    return CbtQuestion(context, query, answer, tuple(sorted(distractors + [answer])))


class _Window:
    """Word counts of the sentences in the current context, overall and per word type."""

    def __init__(self) -> None:
        self.words: Counter[str] = Counter()
        self.by_type: dict[str, Counter[str]] = {t: Counter() for t in WORD_TYPES}

    def add(self, words: Sequence[str], types: Sequence[str | None]) -> None:
        for w, t in zip(words, types):
            self.words[w] += 1
            if t is not None:
                self.by_type[t][w] += 1

    def remove(self, words: Sequence[str], types: Sequence[str | None]) -> None:
        for w, t in zip(words, types):
            _decrement(self.words, w)
            if t is not None:
                _decrement(self.by_type[t], w)


def _decrement(counts: Counter[str], word: str) -> None:
    counts[word] -= 1
    if not counts[word]:
        del counts[word]  # only words in the window stay, so pools cost what the window holds


def _usable(word: str) -> bool:
    """A word can be an answer or candidate: it has a letter and none of the format's separators."""
    return any(c.isalpha() for c in word) and "|" not in word and word != PLACEHOLDER
