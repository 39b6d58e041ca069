"""The prepare job: source text -> ``DIR/{manifest.json, vocab.json, <split>/part-*.parquet}``.

Idempotent: when ``DIR``'s manifest records the same source fingerprint and options and every
file in ``DIR`` verifies against it (``iaa.data.prepared.verify``), nothing is done; a damaged folder is
rebuilt. A dataset of another source or options is replaced only with ``overwrite``. Output is
built in a sibling temporary directory and moved in file by file, the manifest last, so an
interrupted run never leaves a half-written dataset behind; the manifest lists the files it
wrote (``files``), and a rebuild deletes only those (``iaa.jobs.workdir.outputs``).
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iaa import __version__
from iaa.data.prepared import build as B
from iaa.data.formats import cbt, cnn, demo
from iaa.data import bad_input as E
from iaa.data.prepared import manifest as M
from iaa.data.prepared import expected_names, verify
from iaa.data.datasets import DATASETS, TRAINING_SPLITS
from iaa.data.bad_input import DataError
from iaa.files import DiskFullError, disk_full_message, ensure_writable, writing
from iaa.jobs.evaluation.closing import Command, next_block, where
from iaa.jobs.evaluation.result import Result, absent_when_none
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir
from iaa.jobs.workdir import outputs

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PrepareResult(Result):
    """``iaa-cli prepare``: the prepared folder and what it holds, per split.

    ``created``: ``out`` held no prepared dataset and now does; ``rebuilt``: the dataset ``out``
    held (stale, damaged or replaced) was built again. Both are false when it was up to date.
    """

    dataset: str
    out: str
    rebuilt: bool
    created: bool
    counts: dict[str, int]              # examples per split
    skipped: dict[str, Any]             # bad examples skipped (``on_error`` skip), per split
    truncated: dict[str, Any]           # incomplete examples at the end of a source file, left out, per split
    vocab_size: int
    seconds: float
    skipped_reasons: dict[str, dict[str, int]] = field(default_factory=dict)   # per split: count by reason
    # with `expected_test`: how many test questions it lists, how many are here, missing, and not listed
    expected_test: dict[str, int] | None = absent_when_none()

ON_ERROR = ("fail", "skip")
_SPLIT_WORDS = {"train": "training", "valid": "validation"}


def run(
    dataset: str,
    source: Path | None,
    out: Path | None,
    *,
    workdir: Path = Path(DEFAULT_WORKDIR),
    on_error: str = "fail",
    lowercase: bool | None = None,
    min_count: int = 1,
    max_vocab: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    expected_test: Path | None = None,
) -> PrepareResult:
    """Prepare ``dataset`` from ``source`` into ``out`` (default: ``WORKDIR/data/DATASET``).

    Args:
        dataset: one of DATASETS. ``demo`` is generated and needs no source.
        source: CBT: the ``CBTest`` folder or its ``data/``; CNN: the folder holding ``questions/``, or the .tgz.
        on_error: ``fail`` raises DataError at the first bad example; ``skip`` drops and counts them.
        lowercase: fold case of words (None: the dataset's default, off for all; CNN text is lowercase already).
        min_count, max_vocab: vocabulary options (train split only); ``max_vocab`` includes special tokens.
        workers: threads (None: all CPUs). Does not change the output.
        overwrite: replace a dataset that ``out`` holds of another dataset or source path.
        expected_test: CNN only: a list of the test question files the source should hold (one name
            a line, such as rc-data's official ``expected_cnn_test.txt``). Prepare warns of the listed
            questions the test split lacks and of its questions the list does not name; it does not
            change what is prepared.

    Returns:
        The :class:`PrepareResult`. Skipped and cut-off examples are also logged, and so are the
        source's files that are not read (a CNN source's, each kind in one line).
    """
    _check_options(dataset, on_error, min_count, max_vocab)
    listed = _expected_test(dataset, expected_test)
    out = Path(out) if out is not None else Workdir(workdir).data(dataset)
    ensure_writable(out.parent, "the output folder's parent", "give a writable `out` or `workdir`")
    started = time.perf_counter()
    options = {"on_error": on_error, "lowercase": bool(lowercase), "min_count": min_count, "max_vocab": max_vocab}
    if source is not None:
        outputs.refuse_inputs(out, {"the source": source}, folder=True)
    fingerprint = _fingerprint(dataset, source)
    current = _up_to_date(out, dataset=dataset, source=fingerprint, options=options)
    if current is not None:
        return _result(current, out, rebuilt=False, seconds=time.perf_counter() - started, workdir=workdir,
                       expected=_report_expected(out, current, listed, expected_test))
    existed = (out / M.MANIFEST).exists()          # a manifest, even a damaged one: a dataset was there

    source_path = None if source is None else str(Path(source).resolve())
    previous = _replaceable(out, overwrite=overwrite, dataset=dataset, source_path=source_path)
    header = {"dataset": dataset, "created_by": f"iaa {__version__}", "options": options, "source": fingerprint,
              "source_path": source_path}
    manifest = _build(dataset, source, out, header, previous, workers=workers, progress=progress)
    _report(manifest)
    _report_shared(out, manifest)
    return _result(manifest, out, rebuilt=existed, created=not existed, seconds=time.perf_counter() - started,
                   workdir=workdir, expected=_report_expected(out, manifest, listed, expected_test))


def _check_options(dataset: str, on_error: str, min_count: int, max_vocab: int | None) -> None:
    """A DataError for an unknown dataset or on_error, or a vocabulary option out of range."""
    if dataset not in DATASETS:
        raise DataError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if on_error not in ON_ERROR:
        raise DataError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if min_count < 1:
        raise DataError(f"`min_count` must be >= 1, got {min_count}")
    if max_vocab is not None and max_vocab < 4:
        raise DataError(f"max_vocab must be at least 4 (3 special tokens and a word), got {max_vocab}")


def _build(dataset: str, source: Path | None, out: Path, header: dict[str, Any], previous: list[str], *,
           workers: int | None, progress: bool) -> M.Manifest:
    """Build the shards, vocabulary and manifest in a temporary folder beside ``out``, then install
    them over ``previous`` (the files of the dataset ``out`` held); returns the manifest. A split
    left without a usable example is a DataError, and nothing is written."""
    options = header["options"]
    tmp = outputs.building(out)
    try:
        sources, vocab_opts = _sources(dataset, source, tmp, on_error=options["on_error"],
                                       lowercase=options["lowercase"], min_count=options["min_count"],
                                       max_vocab=options["max_vocab"])
        with writing(out):
            manifest = B.build(tmp, sources, vocab_opts, workers=workers, progress=progress, header=header)
        for split, entry in manifest.splits.items():
            if not entry.count:
                _report(manifest)
                raise DataError(f"no usable {_SPLIT_WORDS.get(split, split)} example (skipped: {sum(entry.skipped.values())}, "
                                f"cut off: {entry.truncated}); nothing was written to {out}",
                                path=source, reason=E.MISSING_SOURCE)
        with writing(out):
            manifest = manifest.with_files(outputs.files_under(tmp) + ([] if (tmp / M.MANIFEST).exists() else [M.MANIFEST]))
            M.write(tmp, manifest)
        outputs.install(tmp, out, written=manifest.files, previous=previous, manifest=M.MANIFEST)
    except DiskFullError:          # a shard met it: the message names the output, with the free space once tmp is gone
        shutil.rmtree(tmp, ignore_errors=True)
        raise DiskFullError(disk_full_message(out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def ensure_prepared(dataset: str, workdir: Path) -> Path:
    """The prepared directory of ``dataset`` under ``workdir/data``; the demo is generated on first use.

    Raises DataError with the exact ``iaa-cli prepare`` command when a real dataset is not prepared yet.
    """
    out = Workdir(workdir).data(dataset)
    if dataset == "demo":
        run("demo", None, out, progress=False, overwrite=True)
        return out
    if dataset not in DATASETS:
        raise DataError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if M.read(out) is None:
        what = "the CBTest folder" if dataset.startswith("cbt") else "the folder holding questions/ (or cnn.tgz)"
        raise DataError(f"dataset {dataset!r} is not prepared; run:  iaa-cli prepare `dataset` {dataset} "
                        f"`source` PATH `out` {out}  (PATH: {what})", path=out, reason=E.MISSING_SOURCE)
    return out


def _up_to_date(out: Path, **identity: Any) -> M.Manifest | None:
    """The manifest of ``out`` when it was built from this source with these options and its files
    are intact; None where it must be built.

    A damaged folder (bad manifest, changed or missing shard) is not up to date: it is rebuilt.
    """
    try:
        return verify.verify(out) if M.is_current(out, **identity) is not None else None
    except DataError as err:
        _log.info(f"rebuilding: {err}")
        return None


def _fingerprint(dataset: str, source: Path | None) -> dict[str, Any]:
    if dataset == "demo":
        return demo.fingerprint()
    if source is None:
        raise DataError(f"dataset {dataset!r} needs `source`", reason=E.MISSING_SOURCE)
    if dataset == "cnn":
        return cnn.fingerprint(Path(source))
    return M.fingerprint(cbt.find_files(Path(source), dataset.split("-")[1]).values())


def _sources(dataset: str, source: Path | None, tmp: Path, *, on_error: str, lowercase: bool,
             min_count: int, max_vocab: int | None) -> tuple[list[B.SplitSource], B.VocabOptions]:
    if dataset == "cnn":
        layout = cnn.survey(Path(source))  # type: ignore[arg-type]
        for note in layout.notes:
            _log.warning(note)
        sources = cnn.split_sources(layout, on_error=on_error, lowercase=lowercase)
        return sources, B.VocabOptions(cnn.PLACEHOLDER, min_count, max_vocab, keep_pattern=cnn.ENTITY_PATTERN)
    if dataset == "demo":
        files = demo.write_files(tmp / "source")
    else:
        files = cbt.find_files(Path(source), dataset.split("-")[1])  # type: ignore[arg-type]
    parse = functools.partial(cbt.parse_chunk, on_error=on_error, lowercase=lowercase)
    sources = [B.SplitSource(split, functools.partial(_cbt_tasks, path, parse)) for split, path in files.items()]
    return sources, B.VocabOptions(cbt.PLACEHOLDER, min_count, max_vocab)


def _cbt_tasks(path: Path, parse):
    for raw in cbt.iter_chunks(path):
        yield functools.partial(parse, raw)


def _replaceable(out: Path, *, overwrite: bool, dataset: str, source_path: str | None) -> list[str]:
    """The files of the dataset that ``out`` holds, to replace; [] for a new or empty folder.

    The same dataset from the same source path (changed files or options: an update), or one
    whose manifest is damaged, is rebuilt without ``overwrite``; another dataset or source needs
    it; a folder of other files is refused.
    """
    try:
        recorded = M.read(out) if out.is_dir() else None
        damaged = False
    except DataError:
        recorded, damaged = None, True   # a damaged manifest of ours: rebuild it, deleting nothing else
    same = recorded is not None and (recorded.dataset, recorded.source_path) == (dataset, source_path)
    if not outputs.check_folder(out, manifest=M.MANIFEST, kind="prepared dataset", overwrite=overwrite,
                                same=same or damaged):
        return []
    return _recorded_files(recorded) if recorded is not None else [M.MANIFEST, M.VOCAB]


def _recorded_files(manifest: M.Manifest) -> list[str]:
    """What a prepared dataset's manifest says it wrote (older manifests: vocabulary and shards)."""
    if manifest.files:
        return list(manifest.files)
    return [M.MANIFEST, M.VOCAB] + [s.file for split in manifest.splits.values() for s in split.shards]


def _report(manifest: M.Manifest) -> None:
    """Say what was not used, as warnings (shown under ``--quiet`` too, and in ``--json``): skipped
    examples by reason (the first few named) and cut-off trailing examples."""
    for split, entry in manifest.splits.items():
        if entry.skipped:
            reasons = ", ".join(f"{k}: {v}" for k, v in entry.skipped.items())
            _log.warning(f"{split}: skipped {sum(entry.skipped.values())} bad example(s) ({reasons})")
            for msg in entry.skipped_examples[:3]:
                _log.info(f"  {msg}")
        for msg in entry.truncated_examples:
            _log.warning(f"{split}: {msg}")
    missing = [split for split in TRAINING_SPLITS if split not in manifest.splits]
    if missing:
        _log.warning(f"no {' and no '.join(missing)} split in the source: train, tune, ensemble and distill need "
                     f"train and valid (evaluate, predict and explain take what there is)")


def _report_shared(out: Path, manifest: M.Manifest) -> None:
    """Warn of valid or test questions that train holds too: a score on them is not held out."""
    from iaa.data.prepared.overlap import shared_with_train

    for split, n in shared_with_train(out, manifest).items():
        _log.warning(f"{n} of the {manifest.count(split)} {split} questions are in train too (the same query, "
                     f"candidates, answer and document length): a {split} score counts what the reader trained on; "
                     "is a file in the source twice?")


def _expected_test(dataset: str, path: Path | None) -> list[str] | None:
    """The ids ``expected_test`` lists (None without one), read before any work: a bad list stops prepare."""
    if path is None:
        return None
    if dataset != "cnn":
        raise DataError(f"`expected_test` lists CNN test question files, and dataset is {dataset!r}", path=path)
    return expected_names.read_list(Path(path))


def _report_expected(out: Path, manifest: M.Manifest, listed: list[str] | None,
                     path: Path | None) -> dict[str, int] | None:
    """Warn of the test questions ``path`` lists that the prepared test split lacks, and of those it
    holds that the list does not name; the counts, for the result (None without a list)."""
    if listed is None:
        return None
    found = expected_names.compare(listed, expected_names.split_ids(out, manifest, "test"))
    shown = expected_names.SUFFIX
    if found.missing:
        some = ", ".join(name + shown for name in found.missing[:3])
        _log.warning(f"test: {found.present:,} of the {found.listed:,} questions that {path} lists are here, "
                     f"{len(found.missing):,} missing (e.g. {some}): a test score here is not one on the list's "
                     "questions")
    if found.unlisted:
        some = ", ".join(name + shown for name in found.unlisted[:3])
        _log.warning(f"test: {len(found.unlisted):,} question(s) are not among those {path} lists (e.g. {some}): "
                     "a test score here counts them")
    if not found.missing and not found.unlisted:
        _log.info(f"test: the {found.listed:,} questions that {path} lists are all here, and no other")
    return {"listed": found.listed, "present": found.present, "missing": len(found.missing),
            "unlisted": len(found.unlisted)}


def _result(manifest: M.Manifest, out: Path, *, rebuilt: bool, seconds: float, workdir: Path,
            created: bool = False, expected: dict[str, int] | None = None) -> PrepareResult:
    trainable = set(TRAINING_SPLITS) <= set(manifest.splits)
    at = where(workdir)
    return PrepareResult(dataset=manifest.dataset, out=str(Path(out).resolve()), rebuilt=rebuilt, created=created,
                         counts={split: manifest.count(split) for split in manifest.splits},
                         skipped=manifest.skipped, truncated=manifest.truncated,
                         skipped_reasons={split: dict(entry.skipped) for split, entry in manifest.splits.items()
                                          if entry.skipped},
                         vocab_size=manifest.vocab_size, seconds=round(seconds, 3), expected_test=expected,
                         next=(Command.of("train", data=str(out), **at), Command.of("tune", data=str(out), **at))
                         if trainable else ())


def describe(result: PrepareResult) -> str:
    """``prepare``'s closing lines: what the folder holds, and what to run on it."""
    held = ", ".join(f"{n:,} {split}" for split, n in result.counts.items())
    state = "rebuilt" if result.rebuilt else "prepared" if result.created else "up to date"
    lines = [f"prepare: {result.dataset} {state} in {result.out}: {held} questions, a vocabulary of "
             f"{result.vocab_size:,} words"]
    return "\n".join(lines + ([next_block(result.next)] if result.next else []))
