"""The ensemble job on hand-made predictions: alignment, averaging, selection, Boo(n).

No Ray, no MLflow, no torch: members are predictions files written here in the evaluate
job's schema.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iaa.jobs.evaluation.ensembling import averaging as ensemble

pytestmark = pytest.mark.timeout(60)

# The evaluate job's PREDICTION_SCHEMA (iaa/jobs/evaluation/evaluate.py), repeated so these tests need no torch.
PREDICTION_SCHEMA = pa.schema([
    ("example_id", pa.string()),
    ("candidate_words", pa.list_(pa.string())),
    ("probs", pa.list_(pa.float32())),
    ("pred", pa.int32()),
    ("gold", pa.int32()),
])


def write_member(path: Path, ids, cands, probs, gold) -> Path:
    rows = [
        {"example_id": i, "candidate_words": c, "probs": list(p), "pred": int(np.argmax(p)), "gold": g}
        for i, c, p, g in zip(ids, cands, probs, gold)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA), path)
    return path


def binary_members(tmp_path: Path, q_correct: dict[str, list[float]], split: str = "valid") -> list[Path]:
    """Members over 2-candidate examples whose gold is candidate 0; q is P(candidate 0) per example."""
    paths = []
    for name, qs in q_correct.items():
        n = len(qs)
        paths.append(write_member(
            tmp_path / f"{name}-{split}.parquet", [f"ex{e}" for e in range(n)], [["yes", "no"]] * n,
            [[q, 1 - q] for q in qs], [0] * n,
        ))
    return paths


def aligned(paths: list[Path], split: str = "valid") -> ensemble.AlignedSplit:
    return ensemble.align(split, [(p.stem, ensemble.read_predictions(p)) for p in paths])


# Members of a 4-example valid split: B and A are right on 3 of 4 each, on different examples,
# D on 2, and C is confidently wrong everywhere. Listed in the order D, C, B, A.
HAND = {
    "D": [0.2, 0.9, 0.9, 0.05],  # acc 0.50, wrong where B is
    "C": [0.0, 0.0, 0.0, 0.0],   # acc 0.00
    "B": [0.4, 0.9, 0.9, 0.9],   # acc 0.75
    "A": [0.9, 0.9, 0.4, 0.9],   # acc 0.75
}


def test_member_accuracies_and_mean_distribution(tmp_path: Path) -> None:
    split = aligned(binary_members(tmp_path, HAND))
    np.testing.assert_allclose(split.member_accuracies(), [0.5, 0.0, 0.75, 0.75])
    assert split.accuracy([2, 3]) == 1.0          # B + A fix each other's mistakes
    assert split.accuracy([0, 1, 2, 3]) == 0.5    # C drags the full average down


def test_greedy_picks_complementary_pair_not_all(tmp_path: Path) -> None:
    split = aligned(binary_members(tmp_path, HAND))
    chosen, trace = ensemble.select_greedy(split)
    assert chosen == [2, 3]
    assert trace == [{"added": 2, "valid_acc": 0.75}, {"added": 3, "valid_acc": 1.0}]  # tie B/A: B listed first
    assert ensemble.select_all(split) == [0, 1, 2, 3]


def test_greedy_prefers_weaker_member_that_helps_more(tmp_path: Path) -> None:
    # A and B make the same mistake; E is weaker alone but confidently right where A is wrong.
    members = {
        "A": [0.9, 0.9, 0.4, 0.9],    # acc 0.75
        "B": [0.9, 0.9, 0.45, 0.9],   # acc 0.75, same error as A
        "E": [0.45, 0.45, 1.0, 0.6],  # acc 0.50
    }
    split = aligned(binary_members(tmp_path, members))
    assert ensemble.select_greedy(split)[0] == [0, 2]
    assert ensemble.select_top_p(split, 2 / 3) == [0, 1]
    assert split.accuracy([0, 2]) == 1.0 > split.accuracy([0, 1]) == 0.75


def test_top_p_keeps_best_fraction_at_least_one(tmp_path: Path) -> None:
    split = aligned(binary_members(tmp_path, HAND))
    assert ensemble.select_top_p(split, 0.5) == [2, 3]
    assert ensemble.select_top_p(split, 0.75) == [0, 2, 3]
    assert ensemble.select_top_p(split, 0.1) == [2]     # at least one; the tie goes to the first listed
    assert ensemble.select_top_p(split, 1.0) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        ensemble.select_top_p(split, 0.0)


def test_boo_n_hand_example() -> None:
    accs = [0.8, 0.6, 0.7]
    # sorted 0.6, 0.7, 0.8; P(i-th is max of 2 draws) = 1/9, 3/9, 5/9
    assert ensemble.boo_n(accs, 2) == pytest.approx((0.6 * 1 + 0.7 * 3 + 0.8 * 5) / 9, abs=1e-12)
    assert ensemble.boo_n(accs, 1) == pytest.approx(np.mean(accs), abs=1e-12)
    assert ensemble.boo_n(accs, 200) == pytest.approx(0.8, abs=1e-12)
    # test-time Boo: the test score of the best-on-valid draw
    test = [0.7, 0.55, 0.9]
    assert ensemble.boo_n(accs, 2, test) == pytest.approx((0.55 * 1 + 0.9 * 3 + 0.7 * 5) / 9, abs=1e-12)
    assert ensemble.boo_n(accs, 1, test) == pytest.approx(np.mean(test), abs=1e-12)


def test_boo_n_equals_brute_force_over_all_draws() -> None:
    valid = [0.5, 0.7, 0.7, 0.6]   # a tie at the top
    test = [0.4, 0.9, 0.5, 0.8]
    m = len(valid)
    for n in (1, 2, 3):
        total = 0.0
        for draw in itertools.product(range(m), repeat=n):
            best = max(valid[i] for i in draw)
            total += np.mean([test[i] for i in draw if valid[i] == best])  # uniform among tied draws
        assert ensemble.boo_n(valid, n, test) == pytest.approx(total / m**n, abs=1e-12)
        assert ensemble.boo_n(valid, n) == pytest.approx(
            np.mean([max(valid[i] for i in d) for d in itertools.product(range(m), repeat=n)]), abs=1e-12)


def random_members(tmp_path: Path, split: str, n_members: int, seed: int) -> list[Path]:
    """Members with varying candidate counts, each writing its rows in its own order."""
    rng = np.random.default_rng(seed)
    n = 30
    ids = [f"{split}-{e}" for e in range(n)]
    cands = [[f"w{e}_{c}" for c in range(rng.integers(2, 7))] for e in range(n)]
    gold = [int(rng.integers(len(c))) for c in cands]
    paths = []
    for m in range(n_members):
        order = rng.permutation(n)
        probs = [rng.dirichlet(np.ones(len(cands[e]))).astype(np.float32) for e in range(n)]
        paths.append(write_member(
            tmp_path / f"m{m}-{split}.parquet", [ids[e] for e in order], [cands[e] for e in order],
            [probs[e] for e in order], [gold[e] for e in order],
        ))
    return paths


def test_averaging_is_exact_from_members_files(tmp_path: Path) -> None:
    valid = random_members(tmp_path, "valid", 3, seed=1)
    test = random_members(tmp_path, "test", 3, seed=2)
    members = [{"valid": v, "test": t} for v, t in zip(valid, test)]
    result = ensemble.run(members, [f"m{i}" for i in range(3)], tmp_path / "out", select_mode="all")

    out = pq.read_table(result.predictions).to_pylist()
    assert pq.read_schema(result.predictions).equals(ensemble.ENSEMBLE_SCHEMA)
    assert len(out) == 60 and {r["split"] for r in out} == {"valid", "test"}
    by_member = []
    for v, t in zip(valid, test):
        rows = pq.read_table(v).to_pylist() + pq.read_table(t).to_pylist()
        by_member.append({r["example_id"]: r for r in rows})
    correct = {"valid": 0, "test": 0}
    for row in out:
        own = [m[row["example_id"]] for m in by_member]
        assert all(o["candidate_words"] == row["candidate_words"] for o in own)
        assert row["member_probs"] == [o["probs"] for o in own]   # members' float32 values, members' order
        mean = np.array([o["probs"] for o in own], dtype=np.float64).mean(axis=0)
        assert np.array_equal(np.array(row["probs"]), mean)
        assert row["pred"] == int(np.argmax(mean)) and row["gold"] == own[0]["gold"]
        correct[row["split"]] += row["pred"] == row["gold"]
    assert result.valid_acc == correct["valid"] / 30
    assert result.test_acc == correct["test"] / 30
    assert result.members == ["m0", "m1", "m2"]
    assert result.mean_member_valid_acc == pytest.approx(np.mean(result.member_valid_acc))
    assert result.boo_valid == pytest.approx(ensemble.boo_n(result.member_valid_acc, 3))
    assert "ensemble (all, 3 of 3)" in Path(result.table_path).read_text()


def test_run_selects_on_valid_and_scores_test_once(tmp_path: Path) -> None:
    valid = binary_members(tmp_path, HAND, "valid")
    test = binary_members(tmp_path, {k: list(reversed(v)) for k, v in HAND.items()}, "test")
    result = ensemble.run([{"valid": v, "test": t} for v, t in zip(valid, test)], list(HAND), tmp_path / "out",
                          select_mode="greedy")
    assert result.members == ["B", "A"] and result.selected == [2, 3]
    assert result.valid_acc == 1.0 and result.test_acc == 1.0
    assert result.member_test_acc == [0.5, 0.0, 0.75, 0.75]
    assert result.boo_n == 2
    rows = pq.read_table(result.predictions).to_pylist()
    assert all(len(r["member_probs"]) == 2 for r in rows)


def test_missing_test_split_reports_none(tmp_path: Path) -> None:
    valid = binary_members(tmp_path, HAND)
    result = ensemble.run([{"valid": v, "test": None} for v in valid], list(HAND), tmp_path / "out")
    assert result.test_acc is None and result.member_test_acc is None and result.boo_test is None
    assert {r["split"] for r in pq.read_table(result.predictions).to_pylist()} == {"valid"}


def test_alignment_ignores_row_order(tmp_path: Path) -> None:
    ids, cands, gold = ["a", "b", "c"], [["x", "y"], ["x", "y", "z"], ["u", "v"]], [0, 2, 1]
    probs = [[0.7, 0.3], [0.1, 0.2, 0.7], [0.4, 0.6]]
    first = write_member(tmp_path / "first.parquet", ids, cands, probs, gold)
    rev = write_member(tmp_path / "rev.parquet", ids[::-1], cands[::-1], probs[::-1], gold[::-1])
    split = aligned([first, rev])
    np.testing.assert_array_equal(split.probs[0], split.probs[1])
    assert split.member_accuracies().tolist() == [1.0, 1.0]


def test_mismatched_examples_rejected(tmp_path: Path) -> None:
    cands = [["x", "y"]] * 3
    probs = [[0.6, 0.4]] * 3
    good = write_member(tmp_path / "good.parquet", ["a", "b", "c"], cands, probs, [0, 0, 0])
    other = write_member(tmp_path / "other.parquet", ["a", "q", "c"], cands, probs, [0, 0, 0])
    with pytest.raises(ensemble.MismatchError, match=r"member other .*lacks example 'b'"):
        aligned([good, other])
    fewer = write_member(tmp_path / "fewer.parquet", ["a", "b"], cands[:2], probs[:2], [0, 0])
    with pytest.raises(ensemble.MismatchError, match=r"member fewer .*lacks example 'c'"):
        aligned([good, fewer])
    more = write_member(tmp_path / "more.parquet", ["a", "b", "c", "d"], cands + cands[:1], probs + probs[:1],
                        [0, 0, 0, 0])
    with pytest.raises(ensemble.MismatchError, match=r"member more .*has example 'd'"):
        aligned([good, more])


def test_mismatched_candidates_rejected(tmp_path: Path) -> None:
    probs = [[0.6, 0.4]] * 3
    good = write_member(tmp_path / "good.parquet", ["a", "b", "c"], [["x", "y"]] * 3, probs, [0, 0, 0])
    swapped = write_member(tmp_path / "swapped.parquet", ["a", "b", "c"], [["x", "y"], ["y", "x"], ["x", "y"]],
                           probs, [0, 0, 0])
    with pytest.raises(ensemble.MismatchError, match=r"member swapped .*candidates.*example 'b'"):
        aligned([good, swapped])
    regold = write_member(tmp_path / "regold.parquet", ["a", "b", "c"], [["x", "y"]] * 3, probs, [0, 0, 1])
    with pytest.raises(ensemble.MismatchError, match=r"member regold has gold 1 .*example 'c'"):
        aligned([good, regold])


def test_run_rejects_mismatch_on_test_split(tmp_path: Path) -> None:
    valid = binary_members(tmp_path, {"A": [0.9, 0.9], "B": [0.8, 0.2]})
    test_a = write_member(tmp_path / "A-test.parquet", ["t0", "t1"], [["yes", "no"]] * 2, [[0.9, 0.1]] * 2, [0, 0])
    test_b = write_member(tmp_path / "B-test.parquet", ["t0", "t9"], [["yes", "no"]] * 2, [[0.9, 0.1]] * 2, [0, 0])
    with pytest.raises(ensemble.MismatchError, match=r"test: member B .*lacks example 't1'"):
        ensemble.run([{"valid": valid[0], "test": test_a}, {"valid": valid[1], "test": test_b}], ["A", "B"],
                     tmp_path / "out")


def test_the_ensemble_runs_figures_carry_no_float_noise_and_boo_once() -> None:
    from iaa.jobs.ensemble import ensemble_run

    result = ensemble.Averaged(valid_acc=0.75, test_acc=None, member_valid_acc=[0.9623] * 5, member_test_acc=None,
                               mean_member_valid_acc=0.9622999999999999, mean_member_test_acc=None,
                               mean_selected_valid_acc=0.9622999999999999, mean_selected_test_acc=None, boo_n=5,
                               boo_valid=0.30000000000000004, boo_test=None, members=[], selected=[], select="all",
                               p=None, all_members=[], selection_trace=[], examples={}, predictions="", table="",
                               table_path="", calibration={"valid_log_loss": 0.1, "valid_mean_confidence": 0.9},
                               temperature=0.7000000000000001)
    metrics = ensemble_run.metrics(result)
    assert metrics["temperature"] == 0.7
    assert metrics["mean_member_valid_acc"] == 0.9623 and metrics["boo_n_valid"] == 0.3
    assert metrics["best_valid_acc"] == 0.75
    assert sorted(k for k in metrics if k.startswith("boo")) == ["boo_n", "boo_n_valid"]
    assert metrics["valid_log_loss"] == 0.1 and "valid_mean_confidence" not in metrics
    assert ensemble_run.params({"p": 1 / 3, "seeds": 5}) == {"p": 0.3333, "seeds": 5}


def test_given_members_are_labelled_by_run_folder_or_sweep_trial_and_never_twice_alike(tmp_path: Path) -> None:
    from _faults import make_checkpoint, make_prepared
    from fakes import FakeTracker
    from iaa.jobs.ensemble.ensemble import given_members

    _, prepared = make_prepared(tmp_path)
    paths = [make_checkpoint(prepared, tmp_path / "runs" / "demo-iaa-seed0" / "checkpoints" / "best.pt"),
             *(make_checkpoint(prepared, tmp_path / "ray" / "sweep1" / trial / "checkpoint_000001" / "checkpoint.pt")
               for trial in ("1c6955d7", "5a2cc778")),
             *(make_checkpoint(prepared, tmp_path / folder / "model.pt") for folder in ("a", "b"))]
    labels = [m.label for m in given_members(paths, FakeTracker())]
    assert labels == ["demo-iaa-seed0", "sweep1/1c6955d7", "sweep1/5a2cc778", "model (4)", "model (5)"]
