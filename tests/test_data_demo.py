"""Demo dataset: deterministic, valid CBT, answerable only from the query's context."""

from __future__ import annotations

import numpy as np

from iaa.data.formats import cbt, demo
from iaa.data.prepared import manifest as M
from iaa.jobs.datasets import prepare


def test_deterministic_by_seed(tmp_path):
    a = demo.write_files(tmp_path / "a", sizes={"train": 50, "valid": 20})
    b = demo.write_files(tmp_path / "b", sizes={"train": 50, "valid": 20})
    c = demo.write_files(tmp_path / "c", seed=99, sizes={"train": 50, "valid": 20})
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    assert a["train"].read_bytes() != c["train"].read_bytes()
    assert a["train"].read_bytes() != a["valid"].read_bytes()


def oracle(ex) -> str:
    """The grammar's rule: the cast member whose sentence holds the query's place or object."""
    thing = next(w for w in ex.query if w in demo.PLACES or w in demo.OBJECTS)
    sentence = []
    for w in ex.doc:
        sentence.append(w)
        if w == ".":
            if thing in sentence:
                return next(x for x in sentence if x in ex.candidates)
            sentence = []
    raise AssertionError("no sentence holds the query's place or object")


def test_frequency_baseline_is_low_but_context_decides(tmp_path):
    from iaa.jobs.evaluation import frequency

    paths = demo.write_files(tmp_path, sizes={"valid": demo.SIZES["valid"]})
    chunk = cbt.read(paths["valid"])
    examples = chunk.examples()
    off, cand_off = chunk.doc_offsets, chunk.cand_offsets
    doc_cand = [chunk.doc_cand[off[i]:off[i + 1]].tolist() for i in range(len(chunk))]
    assert frequency.accuracy(doc_cand, np.diff(cand_off).tolist(), chunk.answer.tolist()) < 0.40
    assert all(oracle(ex) == ex.answer for ex in examples)
    lens = [len(ex.doc) for ex in examples]
    assert 100 <= sum(lens) / len(lens) <= 250 and max(lens) <= 250
    assert 150 <= len({w for ex in examples for w in ex.doc + ex.query}) <= 500


def test_ensure_prepared_generates_the_demo_once(tmp_path):
    out = prepare.ensure_prepared("demo", tmp_path)
    m = M.read(out)
    assert out == tmp_path / "data" / "demo"
    assert m.counts == demo.SIZES and m.skipped == {s: 0 for s in demo.SIZES}
    assert m.source == demo.fingerprint()
    assert not prepare.run("demo", None, out, progress=False).rebuilt
