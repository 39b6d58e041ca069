"""Documents to splits: whole documents (or whole files) only, so no text is in two splits."""

from __future__ import annotations

import random
from typing import Sequence

from iaa.data.cloze.sources import Document
from iaa.errors import IaaError

SPLIT_BY = ("document", "file")


def assign(docs: Sequence[Document], *, valid: int, test: int, seed: int, split_by: str = "document") -> list[str]:
    """The split of each document.

    A document whose source named a split keeps it. The others are grouped into units (each
    document, or each file with ``split_by="file"``); the units are shuffled with ``seed`` and the
    first ``valid`` go to valid, the next ``test`` to test and the rest to train.

    Raises:
        IaaError: more units asked for valid and test than there are.
    """
    if split_by not in SPLIT_BY:
        raise ValueError(f"split_by must be one of {SPLIT_BY}, got {split_by!r}")
    key = (lambda d: d.doc_id) if split_by == "document" else (lambda d: d.file_id or d.path)
    units = sorted({key(d) for d in docs if d.split is None})
    if valid < 0 or test < 0 or valid + test > len(units):
        raise IaaError(f"`valid` {valid} `test` {test} asks for {valid + test} {split_by}s, but the sources "
                       f"without a split have {len(units)}; ask for fewer, or give SPLIT=PATH sources")
    random.Random(seed).shuffle(units)
    drawn = {u: "valid" for u in units[:valid]} | {u: "test" for u in units[valid:valid + test]}
    return [d.split or drawn.get(key(d), "train") for d in docs]
