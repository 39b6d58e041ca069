"""Loader: bucketed batch plans cover each example exactly once per epoch, and batches pad correctly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from iaa.data.loading.loader import PreparedData, batch_plan, collate, iter_batches, num_batches
from iaa.data.prepared.shards import SCHEMA


@pytest.mark.parametrize("n, batch_size, world_size", [(1, 4, 1), (10, 4, 1), (10, 4, 2), (1000, 32, 1),
                                                       (1000, 32, 3), (997, 64, 4), (5, 100, 5)])
def test_plan_covers_every_example_once_with_equal_batches_per_rank(n, batch_size, world_size):
    lens = np.random.default_rng(0).integers(1, 500, n)
    for epoch in range(2):
        plans = [batch_plan(lens, batch_size, seed=7, epoch=epoch, rank=r, world_size=world_size)
                 for r in range(world_size)]
        rows = np.concatenate([b for plan in plans for b in plan])
        assert sorted(rows.tolist()) == list(range(n))
        assert {len(p) for p in plans} == {num_batches(n, batch_size, world_size)}
        assert all(0 < len(b) <= batch_size for plan in plans for b in plan)


def test_plan_is_deterministic_shuffled_by_epoch_and_groups_lengths():
    lens = np.random.default_rng(1).integers(1, 1000, 5000)
    a = batch_plan(lens, 32, seed=3, epoch=0)
    assert all(np.array_equal(x, y) for x, y in zip(a, batch_plan(lens, 32, seed=3, epoch=0)))
    b = batch_plan(lens, 32, seed=3, epoch=1)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))
    padded = sum(len(r) * lens[r].max() for r in a)
    random_cut = np.array_split(np.random.default_rng(2).permutation(5000), len(a))
    assert padded < 0.75 * sum(len(r) * lens[r].max() for r in random_cut)
    ordered = batch_plan(lens, 32, seed=0, epoch=0, shuffle=False)
    assert [lens[r].max() for r in ordered] == sorted(lens[r].max() for r in ordered)


def table(rows: list[dict]) -> pa.Table:
    full = [{**r, "example_id": str(i), "candidates": [5] * len(r["candidate_words"]),
             "doc_len": len(r["doc"]), "query_len": len(r["query"])} for i, r in enumerate(rows)]
    return pa.Table.from_pylist(full, schema=SCHEMA)


def test_collate_pads_with_masks_and_minus_one_candidates():
    t = table([
        {"doc": [4, 5, 6], "query": [2, 7], "candidate_words": ["a", "b"], "answer": 1, "doc_cand": [-1, 0, 1]},
        {"doc": [8], "query": [9, 2, 3], "candidate_words": ["c", "d", "e"], "answer": 2, "doc_cand": [2]},
    ])
    b = collate(t)
    assert b.doc.tolist() == [[4, 5, 6], [8, 0, 0]] and b.doc.dtype == torch.int64
    assert b.doc_mask.tolist() == [[True, True, True], [True, False, False]]
    assert b.query.tolist() == [[2, 7, 0], [9, 2, 3]] and b.query_mask.sum().item() == 5
    assert b.doc_cand.tolist() == [[-1, 0, 1], [2, -1, -1]]
    assert b.cand_mask.tolist() == [[True, True, False], [True, True, True]]
    assert b.answer.tolist() == [1, 2] and b.example_ids == ["0", "1"] and len(b) == 2


def test_iter_batches_over_a_prepared_split(tmp_path):
    from test_data_prepare import make_cbtest
    from iaa.jobs.datasets import prepare

    prepare.run("cbt-ne", make_cbtest(tmp_path), tmp_path / "out", progress=False)
    data = PreparedData.open(tmp_path / "out")
    train = data.table("train")
    seen = []
    for rank in range(2):
        for b in iter_batches(train, 2, seed=1, epoch=0, rank=rank, world_size=2):
            assert b.doc.shape == b.doc_mask.shape == b.doc_cand.shape
            assert (b.doc_cand[~b.doc_mask] == -1).all()
            assert b.cand_mask[torch.arange(len(b)), b.answer].all()
            seen += b.example_ids
    assert sorted(seen) == sorted(train.column("example_id").to_pylist())
    assert [b.example_ids for b in iter_batches(train, 4, seed=0, epoch=0, shuffle=False)] == \
           [b.example_ids for b in iter_batches(train, 4, seed=9, epoch=5, shuffle=False)]
