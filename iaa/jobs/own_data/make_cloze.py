"""The make-cloze job: text files -> CBT or CNN question files that ``iaa-cli prepare`` reads.

Steps: read the documents, tag them (in this process, or on Ray with one tagger per actor),
drop documents too short for one question, assign whole documents to splits, cut the questions
with the style's recipe and write the official files. The output is built in a sibling folder
and moved in file by file when complete, ``cloze.json`` last; it lists the files written, and a
rebuild deletes only those (``iaa.jobs.workdir.outputs``). Only tagging runs in parallel; the questions depend on the
inputs, the options and the seed alone (each document draws from its own seeded generator),
so the same inputs and seed give byte-identical files, with or without Ray.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from iaa import logs
from iaa.data import bad_input as E
from iaa.data.cloze import cbt_recipe, cnn_recipe, splits, writers
from iaa.data.cloze.sources import TOKENS, Document, SourceSpec, read_documents
from iaa.data.cloze.tagging import DEFAULT_PIPELINE, TaggedSentence, Tagger, Unit, check_pipeline, decode, \
    make_units, spacy_factory, tag_units
from iaa.data.bad_input import DataError
from iaa.data.datasets import CLOZE_STYLES
from iaa.errors import IaaError
from iaa.jobs.config.job_config import ConfigError
from iaa.files import atomic_write_text, writing
from iaa.jobs.own_data import cloze_summary
from iaa.jobs.own_data.cloze_summary import ClozeResult
from iaa.jobs.ports import TagMap
from iaa.jobs.workdir import outputs
from iaa.jobs.workdir.paths import Workdir

STYLES = CLOZE_STYLES
MANIFEST = "cloze.json"
LOCAL_BATCH_UNITS = 4
# What each recipe reads from the tagger: CN is "a noun that is not a named entity", so it needs both.
NEEDS = {"cbt-ne": frozenset({"tags", "ents"}), "cbt-cn": frozenset({"tags", "ents"}), "cbt-v": frozenset({"tags"}),
         "cbt-p": frozenset({"tags"}), "cnn": frozenset({"ents"})}


@dataclass(frozen=True)
class ClozeConfig:
    """What questions to make; everything that decides the output bytes.

    Attributes:
        style: one of STYLES.
        sources: inputs, each maybe bound to a split.
        valid, test: documents (or files, see ``split_by``) drawn for valid and test.
        split_by: ``document`` or ``file``: the unit that never straddles two splits.
        seed: draws the splits, answers, distractors and entity numbers.
        stride: sentences between two windows [default: 1 for CBT, 8 for CNN].
        context: CNN document length in sentences (CBT's is fixed at 20).
        pipeline: spaCy pipeline name.
    """

    style: str
    sources: tuple[SourceSpec, ...]
    valid: int = 0
    test: int = 0
    split_by: str = "document"
    seed: int = 0
    stride: int | None = None
    context: int = cnn_recipe.CONTEXT
    pipeline: str = DEFAULT_PIPELINE

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ConfigError(f"style must be one of {STYLES}, got {self.style!r}")
        if (self.stride is not None and self.stride < 1) or self.context < 1:
            raise ValueError(f"stride and context must be at least 1, got {self.stride} and {self.context}")

    @property
    def window(self) -> int:
        """Sentences one question needs."""
        return self.context + 1 if self.style == "cnn" else cbt_recipe.CONTEXT + 1


@dataclass
class Tagged:
    """The documents kept for questions, their tagging, and what was skipped.

    Each document's tagging stays encoded (a few bytes a word) until its questions are cut:
    decoded, a 12M-token corpus would take gigabytes.
    """

    docs: list[Document]
    encoded: list[list[str]]           # per document, its units' encoded tagging
    skipped: list[str] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def sentences(self, i: int) -> list[TaggedSentence]:
        return [s for text in self.encoded[i] for s in decode(text)]


def run(cfg: ClozeConfig, out: Path, *, workers: int | None = 0, tag_map: TagMap | None = None,
        tagger: Callable[[], Tagger] | None = None, progress: bool = True, overwrite: bool = False,
        workdir: Path | None = None) -> ClozeResult:
    """Make the questions of ``cfg`` into ``out``.

    Args:
        workers: 0 tags in this process; N > 0 with ``tag_map`` on N tagger actors; None with one
            actor per CPU of the cluster.
        tag_map: maps the tagger over work units on a cluster (``iaa.platform.cloze_ray.tag``).
        tagger: zero-argument factory of the tagger [default: spaCy with ``cfg.pipeline``].
        overwrite: replace questions of another config that ``out`` holds (the same config is
            remade without it).
        workdir: the work folder whose stores (prepared data, runs, sweeps, ensembles, Ray storage,
            the MLflow and Optuna files) ``out`` must neither be, lie in, nor hold.

    Returns:
        The :class:`ClozeResult`.

    Raises:
        DataError: an empty or undecodable file, or no document long enough for one question.
        IaaError: the tagger is missing, or the split sizes do not fit.
    """
    started = time.perf_counter()
    out = Path(out)
    outputs.refuse_inputs(out, {"the source": [spec.path for spec in cfg.sources]}, folder=True)
    if workdir is not None:
        _refuse_stores(out, Workdir(workdir))
    previous = _replaceable(out, cfg, overwrite)
    docs = read_documents(list(cfg.sources))
    # the split sizes against the documents read, before the tagger (or a cluster) starts
    splits.assign(docs, valid=cfg.valid, test=cfg.test, seed=cfg.seed, split_by=cfg.split_by)
    if tagger is None:
        check_pipeline(cfg.pipeline)
    factory = tagger or spacy_factory(cfg.pipeline, needs=NEEDS[cfg.style])
    tagged = tag_documents(docs, cfg.window, factory, workers=workers, tag_map=tag_map, progress=progress)
    split_of = splits.assign(tagged.docs, valid=cfg.valid, test=cfg.test, seed=cfg.seed, split_by=cfg.split_by)
    counts, documents, tally = _build(cfg, out, tagged, split_of, previous)
    return ClozeResult(style=cfg.style, out=str(Path(out).resolve()), documents={s: len(v) for s, v in documents.items()},
                       questions=counts, warnings=tuple(small_splits(counts)), skipped_documents=len(tagged.skipped),
                       tokens=tagged.tokens, **cloze_summary.funnel(tally, tagged.skipped),
                       tagging_seconds=round(tagged.seconds, 2),
                       tokens_per_s=round(tagged.tokens / max(tagged.seconds, 1e-9)),
                       seconds=round(time.perf_counter() - started, 2),
                       next=cloze_summary.next_commands(cfg.style, out, counts))


def _build(cfg: ClozeConfig, out: Path, tagged: Tagged, split_of: list[str],
           previous: list[str]) -> tuple[dict[str, int], dict[str, list[str]], Counter[str]]:
    """Write the question files and ``cloze.json`` in a sibling folder, then move them into ``out``
    (replacing the ``previous`` files listed there); the sibling is removed whatever happens.

    Returns the questions per split, the document ids per split and the tally of the recipe's funnel."""
    tmp = outputs.building(out)
    try:
        tally: Counter[str] = Counter()
        with writing(out):
            counts = _write(cfg, tmp, tagged, split_of, tally)
        documents = {s: [d.doc_id for d, sp in zip(tagged.docs, split_of) if sp == s] for s in counts}
        manifest = {"style": cfg.style, "config": _config_record(cfg), "questions": counts,
                    "documents": documents, "skipped_documents": tagged.skipped,
                    "files": outputs.files_under(tmp) + [MANIFEST]}
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        outputs.install(tmp, out, written=manifest["files"], previous=previous, manifest=MANIFEST)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return counts, documents, tally


MEASURABLE_QUESTIONS = 400   # an accuracy on fewer has a standard error above 2.5 points


def small_splits(counts: Mapping[str, int]) -> list[str]:
    """A warning for each evaluation split too small to measure an accuracy on, with the
    standard error of an accuracy at that size (at its worst, 50%: sqrt(0.25 / n))."""
    notes = []
    for split in ("valid", "test"):
        n = counts.get(split, 0)
        if 0 < n < MEASURABLE_QUESTIONS:
            notes.append(f"the {split} split has only {n} questions: an accuracy measured on it has a standard "
                         f"error of up to {100 * math.sqrt(0.25 / n):.1f} points, so small differences between "
                         f"models are noise; draw more documents into it (--{split} N) for at least "
                         f"{MEASURABLE_QUESTIONS} questions (2.5 points)")
    if counts.get("valid", 0) == 0:
        notes.append("the valid split is empty: train and tune need one to measure accuracy; give `valid` N")
    return notes


def tag_documents(docs: Sequence[Document], window: int, factory: Callable[[], Tagger], *, workers: int | None = 0,
                  tag_map: TagMap | None = None, progress: bool = True) -> Tagged:
    """Tag the documents long enough for one window; raises DataError when none is."""
    skipped = [_short(d, len(d.pieces), window) for d in docs if d.kind == TOKENS and len(d.pieces) < window]
    keep = [d for d in docs if not (d.kind == TOKENS and len(d.pieces) < window)]
    units = make_units(keep)
    started = time.perf_counter()
    if workers == 0:
        encoded = _tag_here(units, factory, progress)
    elif tag_map is None:
        raise IaaError("tagging on workers needs a cluster map (tag_map); give workers=0 to tag here")
    else:
        encoded = tag_map(units, factory, workers=workers, progress=progress)
    seconds = time.perf_counter() - started
    per_doc: list[list[str]] = [[] for _ in keep]
    for u, text in zip(units, encoded):
        per_doc[u.doc].append(text)
    result = Tagged([], [], skipped, sum(_words(t) for t in encoded), seconds)
    for doc, texts in zip(keep, per_doc):
        n = sum(t.count("\n") + 1 for t in texts if t)
        if n < window:
            result.skipped.append(_short(doc, n, window))
        else:
            result.docs.append(doc)
            result.encoded.append(texts)
    if not result.docs:
        first = docs[0] if docs else None
        raise DataError(f"no document is long enough for one question: {result.skipped[0] if result.skipped else ''}",
                        path=first.path if first else None, reason=E.MISSING_SOURCE)
    return result


def _words(encoded: str) -> int:
    """Words in an encoded unit, without decoding it (words are space-separated in field 1)."""
    return sum(line.split("\t", 1)[0].count(" ") + 1 for line in encoded.split("\n")) if encoded else 0


def _tag_here(units: list[Unit], factory: Callable[[], Tagger], progress: bool) -> list[str]:
    tagger = factory()
    encoded: list[str] = []
    with _bar(len(units), progress) as bar:
        for start in range(0, len(units), LOCAL_BATCH_UNITS):
            batch = units[start:start + LOCAL_BATCH_UNITS]
            encoded.extend(tag_units(tagger, batch))
            bar.update(len(batch))
    return encoded


def _bar(total: int, progress: bool):
    return logs.progress("tagging", "unit", total=total, shown=progress)


def _short(doc: Document, n: int, window: int) -> str:
    return f"{doc.doc_id}: {n} sentence(s), a question needs {window}"


def _write(cfg: ClozeConfig, folder: Path, tagged: Tagged, split_of: list[str],
           tally: Counter[str]) -> dict[str, int]:
    """Write every split's questions under ``folder``; returns the question count per split.
    ``tally`` counts the sentences read and the recipe's windows and drops."""
    folder.mkdir(parents=True)
    counts: dict[str, int] = {}
    for split in ("train", "valid", "test"):
        members = [(d, i) for i, (d, sp) in enumerate(zip(tagged.docs, split_of)) if sp == split]
        if not members:
            continue
        if cfg.style == "cnn":
            counts[split] = _write_cnn(cfg, folder, split, tagged, members, tally)
        else:
            word_type = cfg.style.split("-")[1].upper()
            with open(writers.cbt_path(folder, word_type, split), "w", encoding="utf-8", newline="\n") as f:
                counts[split] = writers.write_cbt(f, (q for d, i in members for q in cbt_recipe.questions(
                    _counted(tagged.sentences(i), tally), word_type, _rng(cfg, d), stride=cfg.stride or 1,
                    tally=tally)))
    return counts


def _counted(sentences: list[TaggedSentence], tally: Counter[str]) -> list[TaggedSentence]:
    tally["sentences"] += len(sentences)
    return sentences


def _write_cnn(cfg: ClozeConfig, folder: Path, split: str, tagged: Tagged, members, tally: Counter[str]) -> int:
    n = 0
    for doc, i in members:
        for q in cnn_recipe.questions(_counted(tagged.sentences(i), tally), _rng(cfg, doc), context=cfg.context,
                                      stride=cfg.stride, tally=tally):
            url = writers.cnn_url(doc.doc_id, q.position)
            path = writers.cnn_path(folder, split, url)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(writers.cnn_text(url, q), encoding="utf-8", newline="\n")
            n += 1
    return n


def _rng(cfg: ClozeConfig, doc: Document) -> random.Random:
    """A generator of its own per document: the questions do not depend on document order."""
    digest = hashlib.sha256(f"{cfg.seed}\0{cfg.style}\0{doc.doc_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _config_record(cfg: ClozeConfig) -> dict[str, Any]:
    record = asdict(cfg)
    record["sources"] = [{"path": str(s.path), "split": s.split} for s in cfg.sources]
    return record


def _refuse_stores(out: Path, workdir: Workdir) -> None:
    """Refuse an ``out`` that is, lies in or holds one of the work folder's stores."""
    root = workdir.root
    stores = [root / "data", root / "runs", workdir.sweeps, workdir.ensembles, root / "ray",
              root / Workdir.TRACKING_DB, root / "optuna.db"]
    for store in stores:
        if outputs.inside(out, store) and (store.exists() or outputs.same_path(out, store)):
            raise outputs.OutputError(f"{out}: `out` lies in the work folder's store {store}; "
                                      "give another `out` (nothing was written)")
    outputs.refuse_inputs(out, {"the work folder's store": stores}, folder=True)


def _replaceable(out: Path, cfg: ClozeConfig, overwrite: bool) -> list[str]:
    """The files of the questions that ``out`` holds, to replace; [] for a new or empty folder."""
    try:
        recorded = json.loads((out / MANIFEST).read_text(encoding="utf-8")) if (out / MANIFEST).is_file() else None
    except (OSError, ValueError):
        recorded = {}   # a damaged manifest of ours: remake it, deleting nothing else
    if not isinstance(recorded, dict) and recorded is not None:
        recorded = {}
    same = recorded == {} or (recorded is not None and recorded.get("config") == _config_record(cfg))
    if not outputs.check_folder(out, manifest=MANIFEST, kind="cloze question set", overwrite=overwrite, same=same):
        return []
    files = (recorded or {}).get("files")
    if isinstance(files, list):
        return [f for f in files if isinstance(f, str)]
    # written before cloze.json listed its files: the names the writers give
    cbt = [writers.cbt_path(Path(), t, split).as_posix() for t in ("NE", "CN", "V", "P") for split in writers.CBT_SUFFIX]
    cnn = [p.relative_to(out).as_posix() for folder in writers.CNN_FOLDER.values()
           for p in (out / "questions" / folder).glob("*.question")]
    return cbt + cnn + [MANIFEST]
