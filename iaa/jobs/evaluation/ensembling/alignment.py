"""Members' predictions aligned by example: matched by ``example_id``, then checked to hold the
same ``candidate_words`` (and gold index) for every example, never by row position alone. A
member with another example set or other candidates is rejected with a :class:`MismatchError`
naming it and the first example that differs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iaa.errors import IaaError


REQUIRED_COLUMNS: tuple[str, ...] = ("example_id", "candidate_words", "probs", "gold")


class MismatchError(IaaError, ValueError):
    """Members' predictions cover different examples, or different candidates for one example."""


@dataclass(frozen=True)
class AlignedSplit:
    """The predictions of M members on one split, aligned to the first member's example order.

    Candidate counts vary per example (CNN), so ``probs`` is padded with 0 past each example's
    candidates and ``cand_mask`` marks the real ones.
    """

    split: str
    names: tuple[str, ...]            # (M,)
    example_ids: list[str]            # (E,)
    candidate_words: list[list[str]]  # (E, C_e)
    gold: np.ndarray                  # (E,) int64 index into the candidates
    probs: np.ndarray                 # (M, E, C) float64, C = max C_e
    cand_mask: np.ndarray             # (E, C) bool, True for a real candidate

    @property
    def num_members(self) -> int:
        return int(self.probs.shape[0])

    def mean_probs(self, members: Sequence[int]) -> np.ndarray:
        """(E, C) arithmetic mean of the given members' distributions."""
        if len(members) == 0:
            raise IaaError("an ensemble needs at least one member")
        return self.probs[list(members)].mean(axis=0)

    def predict(self, probs: np.ndarray) -> np.ndarray:
        """(E,) argmax over each example's real candidates; ties go to the first."""
        return np.where(self.cand_mask, probs, -np.inf).argmax(axis=1)

    def accuracy_of(self, probs: np.ndarray) -> float:
        return float((self.predict(probs) == self.gold).mean())

    def accuracy(self, members: Sequence[int]) -> float:
        """Accuracy of the mean distribution of ``members``."""
        return self.accuracy_of(self.mean_probs(members))

    def member_accuracies(self) -> np.ndarray:
        """(M,) each member's own accuracy."""
        return np.array([self.accuracy_of(self.probs[m]) for m in range(self.num_members)])


def read_predictions(path: Path) -> pa.Table:
    """An evaluate-job predictions file, checked to have the columns an ensemble needs."""
    path = Path(path)
    if not path.is_file():
        raise IaaError(f"no predictions file at {path}")
    table = pq.read_table(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise IaaError(f"{path} is not a predictions file: it lacks columns {missing}")
    return table


def _first_duplicate(ids: Sequence[str]) -> str | None:
    seen: set[str] = set()
    for example_id in ids:
        if example_id in seen:
            return example_id
        seen.add(example_id)
    return None


def align(split: str, members: Sequence[tuple[str, pa.Table]]) -> AlignedSplit:
    """Align members' predictions on one split by ``example_id``, checking candidates and gold.

    Args:
        split: the split's name, for messages and the output.
        members: ``(name, predictions table)`` per member; the first sets the example order.

    Raises:
        MismatchError: a member lacks an example of the first member or has an extra one, lists
            an example twice, or differs from the first member in an example's
            ``candidate_words``, gold index, or number of probabilities.
    """
    if not members:
        raise IaaError("an ensemble needs at least one member")
    ref_name, ref_table = members[0]
    ref_ids = ref_table.column("example_id").to_pylist()
    if not ref_ids:
        raise IaaError(f"{split}: member {ref_name} has no predictions")
    ref_cands = ref_table.column("candidate_words").to_pylist()
    ref_gold = ref_table.column("gold").to_pylist()
    width = max(len(c) for c in ref_cands)
    probs = np.zeros((len(members), len(ref_ids), width), dtype=np.float64)    # (M, E, C)
    mask = np.zeros((len(ref_ids), width), dtype=bool)                         # (E, C)
    for e, cands in enumerate(ref_cands):
        mask[e, : len(cands)] = True

    for m, (name, table) in enumerate(members):
        row_of = _rows_by_id(split, name, table.column("example_id").to_pylist(), ref_name, ref_ids)
        cands = table.column("candidate_words").to_pylist()
        gold = table.column("gold").to_pylist()
        member_probs = table.column("probs").to_pylist()
        for e, example_id in enumerate(ref_ids):
            row = row_of[example_id]
            _check_example(f"{split}: member {name}", f"member {ref_name}", example_id,
                           (cands[row], gold[row], len(member_probs[row])), (ref_cands[e], ref_gold[e]))
            probs[m, e, : len(ref_cands[e])] = member_probs[row]
    return AlignedSplit(
        split=split,
        names=tuple(name for name, _ in members),
        example_ids=ref_ids,
        candidate_words=ref_cands,
        gold=np.asarray(ref_gold, dtype=np.int64),
        probs=probs,
        cand_mask=mask,
    )


def _rows_by_id(split: str, name: str, ids: list[str], ref_name: str, ref_ids: list[str]) -> dict[str, int]:
    """Row of each example id in a member's table; MismatchError unless it covers exactly ``ref_ids``."""
    dup = _first_duplicate(ids)
    if dup is not None:
        raise MismatchError(f"{split}: member {name} lists example {dup!r} more than once")
    row_of = {example_id: row for row, example_id in enumerate(ids)}
    if len(row_of) != len(ref_ids) or any(e not in row_of for e in ref_ids):
        missing = next((e for e in ref_ids if e not in row_of), None)
        ref_set = set(ref_ids)
        extra = next((e for e in ids if e not in ref_set), None)
        what = (f"lacks example {missing!r}" if missing is not None else f"has example {extra!r}")
        raise MismatchError(
            f"{split}: member {name} covers other examples than member {ref_name}: it {what} "
            f"({len(ids)} vs {len(ref_ids)} examples); were they evaluated on the same prepared data?"
        )
    return row_of


def _check_example(who: str, ref: str, example_id: str, got: tuple[list[str], int, int],
                   want: tuple[list[str], int]) -> None:
    """MismatchError unless a member's (candidates, gold, number of probabilities) agree with the reference."""
    cands, gold, n_probs = got
    ref_cands, ref_gold = want
    if cands != ref_cands:
        raise MismatchError(f"{who} has other candidates than {ref} for example {example_id!r}: "
                            f"{cands} vs {ref_cands}")
    if gold != ref_gold:
        raise MismatchError(f"{who} has gold {gold} but {ref} has {ref_gold} for example {example_id!r}")
    if n_probs != len(ref_cands):
        raise MismatchError(f"{who} gives {n_probs} probabilities for the {len(ref_cands)} candidates of "
                            f"example {example_id!r}")
