"""Writers of the official formats: CBT question files and CNN ``.question`` files.

CBT: ``cbtest_<TYPE>_{train,valid_2000ex,test_2500ex}.txt``, one example per 21 numbered lines and a
blank line. CNN: ``questions/{training,validation,test}/<sha1 of the url>.question``, as DeepMind's
rc-data names them. Both are read back unchanged by :mod:`iaa.data.formats.cbt` and :mod:`iaa.data.formats.cnn`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, TextIO

from iaa.data.cloze.cbt_recipe import CbtQuestion
from iaa.data.cloze.cnn_recipe import CnnQuestion

CBT_SUFFIX = {"train": "train", "valid": "valid_2000ex", "test": "test_2500ex"}
CNN_FOLDER = {"train": "training", "valid": "validation", "test": "test"}


def cbt_path(out: Path, word_type: str, split: str) -> Path:
    return out / f"cbtest_{word_type}_{CBT_SUFFIX[split]}.txt"


def write_cbt(f: TextIO, questions: Iterable[CbtQuestion]) -> int:
    """Write questions to an open text file; returns how many."""
    n = 0
    for q in questions:
        for i, sentence in enumerate(q.context, start=1):
            f.write(f"{i} {sentence}\n")
        f.write(f"{len(q.context) + 1} {q.query}\t{q.answer}\t\t{'|'.join(q.candidates)}\n\n")
        n += 1
    return n


def cnn_url(doc_id: str, position: int) -> str:
    """The first line of a question file: where the text came from (no whitespace)."""
    return f"cloze:{'_'.join(doc_id.split())}#{position}"


def cnn_text(url: str, q: CnnQuestion) -> str:
    entities = "".join(f"{e}:{name}\n" for e, name in q.entities)
    return f"{url}\n\n{' '.join(q.context)}\n\n{' '.join(q.query)}\n\n{q.answer}\n\n{entities}"


def cnn_path(out: Path, split: str, url: str) -> Path:
    return out / "questions" / CNN_FOLDER[split] / f"{hashlib.sha1(url.encode()).hexdigest()}.question"
