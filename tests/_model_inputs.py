"""Small random batches for the model tests."""

from __future__ import annotations

import pytest
import torch

from iaa.data.loading.batch import Batch


def random_batch(doc_lens: list[int], query_lens: list[int], vocab: int = 40, cands: int = 4,
                 seed: int = 0, pad_to: tuple[int, int] | None = None) -> Batch:
    """A right-padded batch; each candidate occurs 0-2 times, the answer at least once."""
    g = torch.Generator().manual_seed(seed)
    n = len(doc_lens)
    ld = max(doc_lens) if pad_to is None else pad_to[0]
    lq = max(query_lens) if pad_to is None else pad_to[1]
    doc = torch.zeros(n, ld, dtype=torch.int64)
    query = torch.zeros(n, lq, dtype=torch.int64)
    doc_cand = torch.full((n, ld), -1, dtype=torch.int64)
    answer = torch.zeros(n, dtype=torch.int64)
    for b, (dl, ql) in enumerate(zip(doc_lens, query_lens)):
        doc[b, :dl] = torch.randint(cands + 1, vocab, (dl,), generator=g)
        query[b, :ql] = torch.randint(1, vocab, (ql,), generator=g)
        positions = torch.randperm(dl, generator=g)
        answer[b] = int(torch.randint(cands, (1,), generator=g))
        slots = [int(answer[b])] + [int(c) for c in torch.randint(-1, cands, (min(dl, 2 * cands) - 1,), generator=g)]
        for pos, cand in zip(positions.tolist(), slots):
            if cand >= 0:
                doc_cand[b, pos] = cand
                doc[b, pos] = cand + 1                     # candidate a is word a + 1
    doc_mask = torch.arange(ld) < torch.tensor(doc_lens).unsqueeze(1)
    query_mask = torch.arange(lq) < torch.tensor(query_lens).unsqueeze(1)
    return Batch(doc, doc_mask, query, query_mask, doc_cand, torch.ones(n, cands, dtype=torch.bool),
                 answer, [f"ex{b}" for b in range(n)],
                 doc_lengths=torch.tensor(doc_lens), query_lengths=torch.tensor(query_lens))


def select(batch: Batch, index: int) -> Batch:
    """Example ``index`` alone, cut to its own lengths (no padding)."""
    ld, lq = int(batch.doc_mask[index].sum()), int(batch.query_mask[index].sum())
    return Batch(batch.doc[index: index + 1, :ld], batch.doc_mask[index: index + 1, :ld],
                 batch.query[index: index + 1, :lq], batch.query_mask[index: index + 1, :lq],
                 batch.doc_cand[index: index + 1, :ld], batch.cand_mask[index: index + 1],
                 batch.answer[index: index + 1], [batch.example_ids[index]])


@pytest.fixture(autouse=True)
def one_thread():
    """Run model tests on one intra-op thread: tiny tensors gain nothing from a second one, and
    on a loaded machine every parallel region would wait for a descheduled thread (~10-50x)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
