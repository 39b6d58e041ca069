"""Data-parallel workers read their own rows: disjoint, covering, balanced, and only from their shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from iaa.data.loading import loader
from iaa.data.loading.loader import PreparedData, rank_range
from iaa.data.prepared.shards import file_sha256
from tests._tiny import make_tiny_prepared

pytestmark = pytest.mark.timeout(120)
PARTS = (70, 70, 52)       # the tiny train split (192 rows) rewritten as three shards


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_tiny_prepared(tmp_path_factory.mktemp("tiny"))
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    entry = manifest["splits"]["train"]
    table = pq.read_table(root / entry["shards"][0]["file"])
    (root / entry["shards"][0]["file"]).unlink()
    shards, start = [], 0
    for i, n in enumerate(PARTS):
        name = f"train/part-{i:05d}.parquet"
        pq.write_table(table.slice(start, n), root / name)
        shards.append({"file": name, "rows": n, "bytes": (root / name).stat().st_size, "sha256": file_sha256(root / name)})
        start += n
    entry["shards"] = shards
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


def test_rank_ranges_cover_every_row_once_with_sizes_within_one() -> None:
    for total in (0, 1, 7, 192):
        for world in (1, 2, 3, 5):
            if total < world:
                continue
            ranges = [rank_range(total, r, world) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            sizes = [hi - lo for lo, hi in ranges]
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        rank_range(10, 2, 2)


def test_ranks_together_read_the_split_once_in_order(three_shards: Path) -> None:
    data = PreparedData.open(three_shards)
    whole = data.table("train").column("example_id").to_pylist()
    assert len(whole) == sum(PARTS)
    for world in (1, 2, 3, 4):
        parts = [data.rank_rows("train", r, world).column("example_id").to_pylist() for r in range(world)]
        assert [i for p in parts for i in p] == whole


def test_a_rank_opens_only_the_shards_holding_its_rows(three_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = loader.pq.ParquetFile
    monkeypatch.setattr(loader.pq, "ParquetFile", lambda path, **kw: opened.append(Path(path).name) or real(path, **kw))
    data = PreparedData.open(three_shards)
    assert data.rank_rows("train", 0, 3).num_rows == 64 and opened == ["part-00000.parquet"]   # rows 0-63
    opened.clear()
    assert data.rank_rows("train", 1, 3).num_rows == 64                                        # rows 64-127
    assert opened == ["part-00000.parquet", "part-00001.parquet"]


def test_a_missing_split_is_named(three_shards: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(three_shards, copy)
    with pytest.raises(Exception, match="no 'dev' split"):
        PreparedData.open(copy).rank_rows("dev", 0, 1)
