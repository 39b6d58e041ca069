"""What to run when a folder of questions (``iaa-cli make-cloze`` output, or raw CBT / CNN files) is
given where a prepared dataset is expected. Each command runs as printed: the prepared copy goes
to a sibling folder, never over its source, and an empty valid split is remade with documents.
Options are named as the jobs name them, ``` `source` ```, which the command line spells as flags
(:mod:`iaa.cli.flags`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

CLOZE_MANIFEST = "cloze.json"      # what make-cloze writes last into its folder
PREPARED_SUFFIX = "-prepared"


def prepared_sibling(source: Path) -> Path:
    """Where ``prepare`` puts the dataset of the question folder ``source``: ``SOURCE-prepared`` beside it."""
    source = Path(source)
    return source.parent / f"{source.name}{PREPARED_SUFFIX}"


def cloze_record(folder: Path) -> dict[str, Any] | None:
    """The ``cloze.json`` of a make-cloze folder; None when it has none (or it is not readable)."""
    try:
        record = json.loads((Path(folder) / CLOZE_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def prepare_command(style: str, source: Path, out: Path | None = None) -> str:
    """``iaa-cli prepare `dataset` STYLE `source` SOURCE `out` SOURCE-prepared``."""
    out = prepared_sibling(source) if out is None else out
    return f"iaa-cli prepare `dataset` {style} `source` {_q(source)} `out` {_q(out)}"


def not_prepared(folder: Path) -> str:
    """The advice for a folder with no prepared ``manifest.json``: prepare it into a sibling folder
    (with its style when make-cloze wrote it), then give that folder as `data`."""
    folder = Path(folder)
    record = cloze_record(folder)
    style = record.get("style") if record is not None else None
    target = prepared_sibling(folder)
    if isinstance(style, str):
        return (f"it holds make-cloze questions: prepare them with {prepare_command(style, folder)}, "
                f"then give `data` {_q(target)}")
    return (f"prepare it first, e.g. with {prepare_command('DATASET', folder)} if it holds CBT or CNN files "
            f"(DATASET: cbt-ne, cbt-cn, cbt-v, cbt-p or cnn), then give `data` {_q(target)}")


def empty_valid(source: Path, prepared: Path) -> str | None:
    """For a dataset prepared from make-cloze questions with no valid split: the make-cloze
    command that draws documents into one (as it was run, with `valid` N and `overwrite`) and the
    ``prepare`` that follows. None when ``source`` is not a make-cloze folder."""
    record = cloze_record(Path(source))
    config = (record or {}).get("config")
    if not isinstance(config, dict) or not isinstance(config.get("style"), str):
        return None
    documents = sum(len(v) for v in ((record or {}).get("documents") or {}).values() if isinstance(v, list))
    valid = max(1, documents // 10)
    make = " ".join(["iaa-cli make-cloze", *_cloze_options(config, valid), "`out`", _q(source), "`overwrite`"])
    again = f"{prepare_command(config['style'], source, prepared)} `overwrite`"
    return f"draw documents into a valid split: {make}; then {again}"


def _cloze_options(config: dict[str, Any], valid: int) -> list[str]:
    options = ["`style`", config["style"]]
    for src in config.get("sources") or []:
        split = f"{src['split']}=" if src.get("split") else ""
        options += ["`sources`", _q(f"{split}{src['path']}")]
    options += ["`valid`", str(valid), "`test`", str(config.get("test", 0)), "`seed`", str(config.get("seed", 0)),
                "`split_by`", str(config.get("split_by", "document"))]
    if config.get("stride") is not None:
        options += ["`stride`", str(config["stride"])]
    if config.get("style") == "cnn":
        options += ["`context`", str(config.get("context", 30))]
    if config.get("pipeline"):
        options += ["`pipeline`", _q(config["pipeline"])]
    return options


def _q(value: Any) -> str:
    return shlex.quote(str(value))
