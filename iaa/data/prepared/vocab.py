"""The vocabulary: built from the training split only, saved as a JSON list of tokens in id order."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iaa.data.bad_input import DataError

PAD, UNK, PLACEHOLDER_ID = 0, 1, 2
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
ENTITY_PATTERN = r"^@entity\d+$"  # CNN's anonymised entities: always kept


@dataclass(frozen=True)
class Vocab:
    """Tokens in id order: ``<pad>``=0, ``<unk>``=1, the placeholder=2, then words by falling count."""

    tokens: tuple[str, ...]

    @property
    def placeholder(self) -> str:
        return self.tokens[PLACEHOLDER_ID]

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, words: pa.Array | Iterable[str]) -> np.ndarray:
        """(n,) int32 id of each word, ``<unk>`` for words not in the vocabulary. Vectorised (Arrow hash lookup)."""
        words = words if isinstance(words, (pa.Array, pa.ChunkedArray)) else pa.array(list(words), pa.string())
        found = pc.index_in(words, value_set=self._array)
        return pc.fill_null(found, UNK).to_numpy(zero_copy_only=False).astype(np.int32)

    def ids_many(self, pieces: list[pa.Array]) -> list[np.ndarray]:
        """``ids`` of several arrays with one hash-table build: [(n_i,) int32]."""
        if not pieces:
            return []
        flat = self.ids(pa.concat_arrays([p.cast(pa.string()) for p in pieces]))
        return np.split(flat, np.cumsum([len(p) for p in pieces])[:-1])

    @property
    def _array(self) -> pa.Array:
        cached = self.__dict__.get("_arr")
        if cached is None:
            cached = pa.array(self.tokens, pa.string())
            object.__setattr__(self, "_arr", cached)
        return cached

    def to_json(self) -> bytes:
        return json.dumps(list(self.tokens), ensure_ascii=False).encode("utf-8")

    @property
    def sha256(self) -> str:
        """Hash of ``vocab.json``'s bytes; checkpoints record it to refuse a mismatched dataset."""
        return hashlib.sha256(self.to_json()).hexdigest()

    def save(self, path: Path) -> None:
        Path(path).write_bytes(self.to_json())

    @classmethod
    def load(cls, path: Path) -> "Vocab":
        return cls.from_json(Path(path).read_text(encoding="utf-8"), path)

    @classmethod
    def from_json(cls, text: str, path: Path | str) -> "Vocab":
        """The vocabulary of ``vocab.json``'s text (read from ``path``: a file, or a checkpoint holding it)."""
        tokens = json.loads(text)
        if not isinstance(tokens, list) or len(tokens) < 3 or tokens[:2] != [PAD_TOKEN, UNK_TOKEN]:
            raise DataError(f"not a vocabulary (expected a JSON list starting {PAD_TOKEN!r}, {UNK_TOKEN!r})", path=path)
        return cls(tuple(tokens))

    @classmethod
    def build(
        cls,
        counts: Iterable[tuple[pa.Array, np.ndarray]],
        *,
        placeholder: str,
        min_count: int = 1,
        max_size: int | None = None,
        keep_pattern: str | None = None,
    ) -> "Vocab":
        """Build from (words (D,), counts (D,)) pieces of the training split, merged by word.

        Args:
            min_count: drop words seen fewer times.
            max_size: cap on the vocabulary size, special tokens included.
            keep_pattern: regex of words kept whatever their count or the cap (CNN's ``@entityN``).

        Order: specials, then kept-pattern words, then the rest by falling count, ties by word.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        table = _merge(list(counts))
        special = {PAD_TOKEN, UNK_TOKEN, placeholder}
        words, totals = table["w"].to_pylist(), table["c"].to_numpy()
        forced = np.zeros(len(words), dtype=bool)
        if keep_pattern is not None and len(words):
            forced = pc.match_substring_regex(table["w"], keep_pattern).to_numpy(zero_copy_only=False)
        kept_forced = [w for w, f in zip(words, forced) if f and w not in special]
        rest = [w for w, f, c in zip(words, forced, totals) if not f and c >= min_count and w not in special]
        room = None if max_size is None else max(max_size - 3 - len(kept_forced), 0)
        return cls((PAD_TOKEN, UNK_TOKEN, placeholder, *kept_forced, *(rest if room is None else rest[:room])))


def _merge(pieces: list[tuple[pa.Array, np.ndarray]]) -> pa.Table:
    """Sum counts of the same word across pieces; columns ``w``, ``c`` sorted by count desc, then word."""
    if not pieces:
        return pa.table({"w": pa.array([], pa.string()), "c": pa.array([], pa.int64())})
    table = pa.table({
        "w": pa.concat_arrays([w.cast(pa.string()) for w, _ in pieces]),
        "c": pa.array(np.concatenate([c for _, c in pieces]).astype(np.int64)),
    })
    table = table.filter(pc.greater(table["c"], 0)).group_by("w").aggregate([("c", "sum")])
    table = table.select(["w", "c_sum"]).rename_columns(["w", "c"])
    return table.sort_by([("c", "descending"), ("w", "ascending")])
