"""Questions that a prepared folder's valid or test split shares with its train split.

A question is its query, its candidates, its answer and its document's length, as prepared: the
same question in two splits (a valid file copied over the train file, a book in both) lets a
score on valid or test count what the reader saw in training.
"""

from __future__ import annotations

from pathlib import Path
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from iaa.data.prepared.manifest import Manifest

KEY_COLUMNS = ["query", "candidate_words", "answer", "doc_len"]


def _keys(root: Path, manifest: Manifest, split: str) -> pa.ChunkedArray:
    """One string per question of ``split``: its query ids, candidates, answer and document length."""
    tables = [pq.read_table(root / shard.file, columns=KEY_COLUMNS) for shard in manifest.splits[split].shards]
    table = pa.concat_tables(tables)
    query = pc.binary_join(pc.cast(table["query"], pa.list_(pa.string())), " ")
    candidates = pc.binary_join(table["candidate_words"], "|")
    return pc.binary_join_element_wise(query, candidates, pc.cast(table["answer"], pa.string()),
                                       pc.cast(table["doc_len"], pa.string()), "\t")


def shared_with_train(root: Path, manifest: Manifest) -> dict[str, int]:
    """Split -> how many of its questions the train split holds too (valid and test, where present)."""
    splits = manifest.splits
    others = [split for split in ("valid", "test") if split in splits]
    if "train" not in splits or not others:
        return {}
    train = _keys(root, manifest, "train")
    shared = {split: int(pc.sum(pc.is_in(_keys(root, manifest, split), value_set=train)).as_py() or 0)
              for split in others}
    return {split: n for split, n in shared.items() if n}
