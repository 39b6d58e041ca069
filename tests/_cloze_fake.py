"""A tiny deterministic tagger with the spaCy wrapper's interface, and synthetic books to tag.

Rules: a capitalised word that does not start its sentence is a proper noun, and a run of them is
one PERSON entity; the first word is an adverb, words of VERBS are verbs (VBD), of PREPS prepositions (IN), other lowercase
words nouns (NN); anything else is punctuation or a determiner.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from iaa.data.cloze.sources import TOKENS
from iaa.data.cloze.tagging import TaggedSentence

VERBS = frozenset("saw met ran gave found took said kept lost made hid fed".split())
PREPS = frozenset("in on at with under near by behind beside over into past".split())
OTHER = frozenset("the a and".split())
NAMES = "Ann Bob Cleo Dan Eve Finn Gus Hana Ivo Jo Kim Lou Max Ned Ola".split()
NOUNS = "cat dog hat boat tree house cake ball box cup door lamp river hill road bird fish rope".split()


class FakeTagger:
    def tag(self, units: Sequence[tuple[str, str]]) -> list[list[TaggedSentence]]:
        return [[tag_words(words) for words in _sentences(kind, text)] for kind, text in units]


def make_fake() -> FakeTagger:
    return FakeTagger()


def _sentences(kind: str, text: str) -> list[list[str]]:
    if kind == TOKENS:
        return [line.split() for line in text.split("\n") if line.strip()]
    out: list[list[str]] = []
    for para in text.split("\n"):
        words: list[str] = []
        for w in re.findall(r"\w+|[^\w\s]", para):
            words.append(w)
            if w in ".!?":
                out.append(words)
                words = []
        if words:
            out.append(words)
    return out


def tag_words(words: list[str]) -> TaggedSentence:
    tags, ents, start = [], [], None
    for i, w in enumerate(words):
        proper = i > 0 and w[:1].isupper()
        tags.append("NNP" if proper else "RB" if i == 0 else "VBD" if w in VERBS else "IN" if w in PREPS
                    else "DT" if w.lower() in OTHER else "NN" if w.isalpha() else ".")
        if proper and start is None:
            start = i
        if not proper and start is not None:
            ents.append((start, i, "PERSON"))
            start = None
    if start is not None:
        ents.append((start, len(words), "PERSON"))
    return TaggedSentence(tuple(words), tuple(tags), tuple(ents))


def sentence(rng: random.Random, names: Sequence[str] = NAMES, nouns: Sequence[str] = NOUNS) -> str:
    who, whom = rng.sample(list(names), 2)
    verb, prep = rng.choice(sorted(VERBS)), rng.choice(sorted(PREPS))
    return f"Then {who} {verb} the {rng.choice(nouns)} {prep} the {rng.choice(nouns)} with {whom} ."


def book(title: str, n: int, seed: int, **kw) -> str:
    """A book in CBT's raw layout: a title line, then ``n`` tokenised sentences."""
    rng = random.Random(seed)
    return f"_BOOK_TITLE_ : {title}\n" + "".join(sentence(rng, **kw) + "\n" for _ in range(n))


def article(n: int, seed: int) -> str:
    """Plain text: ``n`` sentences in paragraphs of 5."""
    rng = random.Random(seed)
    sents = [sentence(rng).replace(" .", ".") for _ in range(n)]
    return "\n\n".join(" ".join(sents[i:i + 5]) for i in range(0, n, 5)) + "\n"
