"""Seed ensembles: align members' predictions, average them, select on valid, score test once.

The paper's best numbers "average the predictions of 5 models trained with different random
seeds". Here a member is one evaluated checkpoint, known only by its predictions files (the
evaluate job's Parquet: ``example_id``, ``candidate_words``, ``probs``, ``pred``, ``gold``). This
module is pure numpy/pyarrow; training and evaluating the members is the platform's business.

- **Alignment** (:mod:`iaa.jobs.evaluation.ensembling.alignment`). Members are matched by ``example_id`` and
  then checked to hold the same ``candidate_words`` (and gold index) for every example, never by
  row position alone. A member with another example set or other candidates is rejected with a
  :class:`MismatchError` naming it and the first example that differs.
- **Averaging.** The ensemble distribution is the arithmetic mean of the members' candidate
  probabilities, per example, in float64 (eq. 2's pointer-sums, renormalised over candidates by
  the evaluate job). Its prediction is the argmax; ties go to the first candidate, as in the
  evaluate job's ``torch.argmax``.
- **Selection** (valid split only): ``all``; ``top-p``, the best ``max(1, floor(p * M))`` members
  by valid accuracy (ties: the member listed first); ``greedy`` forward selection, see
  :func:`select_greedy`. The test split is scored once, for the chosen ensemble.
- **Temperature** (:func:`iaa.jobs.evaluation.calibration.fit_temperature`): fitted to the
  chosen ensemble's valid distributions, it makes their probabilities as sure as they are right
  without changing an answer; the test split shows what it does on questions it was not fitted to.
- **Seed luck.** :func:`boo_n` is Bajgar, Kadlec and Kleindienst's (2018) expected best-of-n
  single-model accuracy, to set beside the ensemble's gain.
"""

from __future__ import annotations

import math
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iaa.errors import IaaError
from iaa.files import atomic_write, atomic_write_text
from iaa.jobs.evaluation import calibration
from iaa.jobs.evaluation.ensembling.alignment import REQUIRED_COLUMNS, AlignedSplit, MismatchError, align, read_predictions

__all__ = ["ENSEMBLE_SCHEMA", "REQUIRED_COLUMNS", "SELECT_MODES", "SPLITS", "AlignedSplit", "Averaged", "MismatchError",
           "align", "boo_n", "read_predictions", "results_table", "run", "select", "select_all", "select_greedy",
           "select_top_p", "write_predictions"]

SELECT_MODES: tuple[str, ...] = ("all", "top-p", "greedy")
SPLITS: tuple[str, ...] = ("valid", "test")

ENSEMBLE_SCHEMA = pa.schema(
    [
        ("example_id", pa.string()),
        ("split", pa.string()),
        ("candidate_words", pa.list_(pa.string())),
        ("member_probs", pa.list_(pa.list_(pa.float32()))),  # (M_selected, C_e), members' own values
        ("probs", pa.list_(pa.float64())),                   # (C_e,) mean over member_probs
        ("calibrated_probs", pa.list_(pa.float64())),        # (C_e,) probs at the ensemble's temperature
        ("pred", pa.int32()),
        ("gold", pa.int32()),
    ]
)


@dataclass(frozen=True, kw_only=True)
class Averaged:
    """What :func:`run` found: the ensemble's and its members' accuracies, what was selected, and
    where the outputs are. ``test`` figures are None without a test split."""

    valid_acc: float
    test_acc: float | None             # the one test evaluation
    member_valid_acc: list[float]      # every member's, in the members' order
    member_test_acc: list[float] | None
    mean_member_valid_acc: float
    mean_member_test_acc: float | None
    mean_selected_valid_acc: float
    mean_selected_test_acc: float | None
    boo_n: int                         # the selected count, n of Boo(n)
    boo_valid: float
    boo_test: float | None
    members: list[str]                 # the selected members' names
    selected: list[int]                # their indices
    select: str
    p: float | None                    # top-p's fraction; None for the other selections
    all_members: list[str]
    selection_trace: list[dict[str, Any]]
    examples: dict[str, int]           # examples per split
    calibration: dict[str, float]      # :func:`calibrations`: the ensemble's and its members' on average
    temperature: float                 # what the ensemble's distributions are scaled by (1.0: as averaged)
    predictions: str                   # the ensemble's predictions.parquet
    table: str                         # results_table's text
    table_path: str                    # where it was written (results.txt)

    def fields(self) -> dict[str, Any]:
        """Every field but the table's text, as the ensemble's record keeps them."""
        return {k: v for k, v in asdict(self).items() if k != "table"}


def _ranked(accs: np.ndarray) -> list[int]:
    """Member indices by accuracy, best first; ties keep the members' order (stable)."""
    return sorted(range(len(accs)), key=lambda i: (-accs[i], i))


def select_all(valid: AlignedSplit) -> list[int]:
    return list(range(valid.num_members))


def select_top_p(valid: AlignedSplit, p: float) -> list[int]:
    """The best ``max(1, floor(p * M))`` members by valid accuracy, in the members' order."""
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p}")
    k = max(1, math.floor(p * valid.num_members + 1e-9))
    return sorted(_ranked(valid.member_accuracies())[:k])


def select_greedy(valid: AlignedSplit) -> tuple[list[int], list[dict[str, Any]]]:
    """Forward selection on valid accuracy, without replacement.

    Start from the best single member. At each step, try adding each remaining member and keep
    the one giving the highest ensemble valid accuracy; stop when none strictly improves it.
    Ties (between starting members, or between additions giving the same accuracy) go to the
    member listed first, which keeps the result deterministic.

    Returns:
        The chosen member indices in the members' order, and the trace of the selection: one
        ``{"added": index, "valid_acc": ensemble accuracy after adding it}`` per step.
    """
    accs = valid.member_accuracies()
    chosen = [_ranked(accs)[0]]
    best = float(accs[chosen[0]])
    trace = [{"added": chosen[0], "valid_acc": best}]
    while len(chosen) < valid.num_members:
        remaining = [j for j in range(valid.num_members) if j not in chosen]
        scores = [(valid.accuracy(chosen + [j]), j) for j in remaining]
        score, j = max(scores, key=lambda s: (s[0], -s[1]))
        if score <= best:
            break
        chosen.append(j)
        best = score
        trace.append({"added": j, "valid_acc": score})
    return sorted(chosen), trace


def select(valid: AlignedSplit, mode: str, p: float = 0.5) -> tuple[list[int], list[dict[str, Any]]]:
    """Member indices chosen by ``mode`` on the valid split, with the greedy trace (else empty)."""
    if mode == "all":
        return select_all(valid), []
    if mode == "top-p":
        return select_top_p(valid, p), []
    if mode == "greedy":
        return select_greedy(valid)
    raise ValueError(f"unknown selection {mode!r}; choose from {list(SELECT_MODES)}")


def boo_n(select_by: Sequence[float], n: int, report: Sequence[float] | None = None) -> float:
    """Expected best-of-n single-model score (Bajgar, Kadlec and Kleindienst 2018, Boo_n).

    Draw n members with replacement from the empirical distribution of m members, keep the one
    best by ``select_by`` (valid accuracy), and take its ``report`` score (default: ``select_by``
    itself). With ``select_by`` sorted ascending, the i-th member is the best of the n draws with
    probability ``(i/m)^n - ((i-1)/m)^n``, so

        Boo_n = sum_i report_(i) * ((i/m)^n - ((i-1)/m)^n).

    On valid this is the expected maximum of n draws. With ``report`` = test accuracies it is the
    paper's test-time Boo_n: the test score of the model that a user picking by validation would
    keep. Members tied in ``select_by`` share their group's probability equally (the draw among
    them is arbitrary), so their ``report`` scores are averaged. ``n = 1`` gives the mean of
    ``report``; large n tends to the ``report`` of the best member(s) by ``select_by``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    keys = np.asarray(select_by, dtype=np.float64)
    values = keys if report is None else np.asarray(report, dtype=np.float64)
    if keys.size == 0 or keys.shape != values.shape:
        raise ValueError("boo_n needs one report value per member and at least one member")
    m = keys.size
    total, below = 0.0, 0
    for key in np.unique(keys):                   # ascending
        group = keys == key
        at_most = below + int(group.sum())
        total += values[group].mean() * ((at_most / m) ** n - (below / m) ** n)
        below = at_most
    return float(total)


def write_predictions(splits: Sequence[AlignedSplit], members: Sequence[int], out: Path,
                      temperature: float = 1.0) -> Path:
    """Write the ensemble's per-example predictions (:data:`ENSEMBLE_SCHEMA`) as zstd Parquet.

    ``member_probs`` holds one list per chosen member, in ``members`` order, with the members'
    own float32 values; ``probs`` is their float64 mean, and ``calibrated_probs`` that mean at
    ``temperature`` (what ``predict`` and ``serve`` answer with).
    """
    rows = []
    for aligned in splits:
        mean = aligned.mean_probs(members)                        # (E, C)
        calibrated = calibration.scaled(mean, temperature)
        pred = aligned.predict(mean)                              # (E,)
        for e, example_id in enumerate(aligned.example_ids):
            c = len(aligned.candidate_words[e])
            rows.append({
                "example_id": example_id,
                "split": aligned.split,
                "candidate_words": aligned.candidate_words[e],
                "member_probs": [aligned.probs[m, e, :c].tolist() for m in members],
                "probs": mean[e, :c].tolist(),
                "calibrated_probs": calibrated[e, :c].tolist(),
                "pred": int(pred[e]),
                "gold": int(aligned.gold[e]),
            })
    table = pa.Table.from_pylist(rows, schema=ENSEMBLE_SCHEMA)
    return atomic_write(out, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def _fmt(value: float | None) -> str:
    return "   -  " if value is None else f"{value:.4f}"


def results_table(result: Mapping[str, Any], labels: Sequence[str] | None = None) -> str:
    """A plain-text table: each member's valid/test accuracy, the means, Boo(n), the ensemble."""
    names = list(labels or result["all_members"])
    valid, test = result["member_valid_acc"], result["member_test_acc"]
    chosen = set(result["selected"])
    width = max([len(n) for n in names] + [30]) + 6
    lines = [f"{'member':<{width}} {'valid':>7} {'test':>7}  selected", "-" * (width + 27)]
    for i, name in enumerate(names):
        t = None if test is None else test[i]
        lines.append(f"{i:>3} {name:<{width - 4}} {_fmt(valid[i]):>7} {_fmt(t):>7}  {'*' if i in chosen else ''}")
    lines.append("-" * (width + 27))
    n, m = len(chosen), len(names)
    rows = [(f"mean member (all {m})", result["mean_member_valid_acc"], result["mean_member_test_acc"])]
    if n != m:
        rows.append((f"mean member (selected {n})", result["mean_selected_valid_acc"], result["mean_selected_test_acc"]))
    rows.append((f"Boo({n}): best of {n} single model{'s' if n > 1 else ''}", result["boo_valid"], result["boo_test"]))
    rows.append((f"ensemble ({result['select']}, {n} of {m})", result["valid_acc"], result["test_acc"]))
    lines += [f"{label:<{width}} {_fmt(v):>7} {_fmt(t):>7}" for label, v, t in rows]
    return "\n".join(lines)


def _mean(values: Sequence[float] | None, members: Sequence[int]) -> float | None:
    return None if values is None else float(np.mean([values[i] for i in members]))


def run(
    member_predictions: Sequence[Mapping[str, Path | None]],
    names: Sequence[str],
    out_dir: Path,
    *,
    select_mode: str = "all",
    p: float = 0.5,
    labels: Sequence[str] | None = None,
    calibrate: bool = True,
) -> Averaged:
    """Ensemble members from their predictions files and write the results under ``out_dir``.

    Args:
        member_predictions: per member, ``{"valid": path, "test": path or None}``. Test is scored
            when every member has it and skipped (reported as None) when none has.
        names: one identifier per member (for example its checkpoint path), used in messages
            and in the result's ``members`` / ``all_members``.
        out_dir: gets ``predictions.parquet`` and ``results.txt``.
        select_mode: ``all``, ``top-p`` or ``greedy``; decided on valid only.
        p: the fraction kept by ``top-p``.
        labels: short names for the table (default: ``names``).
        calibrate: fit the chosen ensemble's temperature on valid; else it stays 1.0.

    Returns:
        The :class:`Averaged` figures, selection and output paths.

    Raises:
        MismatchError: members disagree on examples or candidates.
    """
    if select_mode not in SELECT_MODES:
        raise ValueError(f"unknown selection {select_mode!r}; choose from {list(SELECT_MODES)}")
    aligned = _aligned_splits(member_predictions, names)
    valid = aligned["valid"]
    chosen, trace = select(valid, select_mode, p)
    temperature = calibration.fit_temperature(valid.mean_probs(chosen), valid.gold) if calibrate else 1.0
    found = {**_scores(aligned, chosen, names, temperature), "temperature": temperature,
             "members": [names[i] for i in chosen], "selected": chosen,
             "select": select_mode, "p": p if select_mode == "top-p" else None, "all_members": list(names),
             "selection_trace": trace, "examples": {split: len(a.example_ids) for split, a in aligned.items()}}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = write_predictions(list(aligned.values()), chosen, out_dir / "predictions.parquet", temperature)
    table = results_table(found, labels)
    atomic_write_text(out_dir / "results.txt", table + "\n")
    return Averaged(**found, predictions=str(predictions), table=table, table_path=str(out_dir / "results.txt"))


def _aligned_splits(member_predictions: Sequence[Mapping[str, Path | None]],
                    names: Sequence[str]) -> dict[str, AlignedSplit]:
    """Valid (and test, when every member has it) predictions of all members, aligned by example."""
    if len(member_predictions) != len(names):
        raise ValueError("give one name per member")
    has_test = [m.get("test") is not None for m in member_predictions]
    if any(has_test) and not all(has_test):
        lacking = names[has_test.index(False)]
        raise IaaError(f"member {lacking} has no test predictions while others do")
    splits = [s for s in SPLITS if s == "valid" or all(has_test)]
    return {
        split: align(split, [(name, read_predictions(m[split])) for name, m in zip(names, member_predictions)])
        for split in splits
    }


def _scores(aligned: Mapping[str, AlignedSplit], chosen: list[int], names: Sequence[str],
            temperature: float = 1.0) -> dict[str, Any]:
    """The ensemble's accuracies, every member's, their means and Boo(n), on valid and test, and
    how far its probabilities can be trusted (at ``temperature`` too)."""
    valid, test = aligned["valid"], aligned.get("test")
    member_valid = valid.member_accuracies().tolist()
    member_test = None if test is None else test.member_accuracies().tolist()
    everyone = range(len(names))
    n = len(chosen)
    return {
        "valid_acc": valid.accuracy(chosen),
        "test_acc": None if test is None else test.accuracy(chosen),   # the one test evaluation
        "member_valid_acc": member_valid,
        "member_test_acc": member_test,
        "mean_member_valid_acc": _mean(member_valid, everyone),
        "mean_member_test_acc": _mean(member_test, everyone),
        "mean_selected_valid_acc": _mean(member_valid, chosen),
        "mean_selected_test_acc": _mean(member_test, chosen),
        "boo_n": n,
        "boo_valid": boo_n(member_valid, n),
        "boo_test": None if member_test is None else boo_n(member_valid, n, member_test),
        "calibration": {key: value for split in aligned.values()
                        for key, value in calibrations(split, chosen, temperature).items()},
    }


def calibrations(split: AlignedSplit, chosen: Sequence[int], temperature: float = 1.0) -> dict[str, float]:
    """The log-loss, calibration error and mean confidence of the ensemble of ``chosen`` on
    ``split`` (``SPLIT_log_loss``, ...), of its members on average (``mean_member_SPLIT_log_loss``,
    ...) and, at a ``temperature`` other than 1, of the ensemble scaled by it
    (``calibrated_SPLIT_log_loss``, ...): :mod:`iaa.jobs.evaluation.calibration`."""
    members = [calibration.of(split.probs[m], split.gold) for m in range(split.num_members)]
    mean = calibration.Calibration(*(float(np.mean(values)) for values in zip(*(astuple(c) for c in members))))
    averaged = split.mean_probs(chosen)
    scaled = ({} if temperature == 1.0 else
              calibration.of(calibration.scaled(averaged, temperature), split.gold).fields(f"calibrated_{split.split}_"))
    return {**calibration.of(averaged, split.gold).fields(f"{split.split}_"),
            **mean.fields(f"mean_member_{split.split}_"), **scaled}
