"""What an ensemble's temperature does to its probabilities on questions it was not fitted to.

    python benchmarks/bench_calibration.py ENSEMBLE_DIR [ENSEMBLE_DIR ...] [--folds 2] [--repeats 20] [--out FILE.json]

Reads each ensemble folder's ``predictions.parquet`` (written by ``iaa-cli ensemble``) and, for
the plain average of its members (``probs``):

- **valid, cross-fitted**: the valid questions are split in ``--folds`` random parts; the
  temperature is fitted on all parts but one and the log-loss and calibration error are measured
  on that one, each part in turn, for ``--repeats`` random splittings; the means are reported
  against the plain average's on the same questions. This is the figure for data without a test
  split (cbt-recon), and it is what fitting on valid and answering new questions does.
- **test**, where the ensemble has one: fitted on the whole of valid (as ``iaa-cli ensemble``
  does), measured on test.

Beside them, the members' own figures on average (``member_probs``), plain and each at a
temperature of its own, cross-fitted the same way: what the temperature that training fits
(and the checkpoint keeps) does to a single reader's answers on questions it was not fitted to.
Nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from iaa.jobs.evaluation import calibration


def split_of(table: Any, split: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None:
    """The plain average, the gold answers and each member's distributions of ``split``."""
    rows = [r for r in table.to_pylist() if r["split"] == split]
    if not rows:
        return None
    members = [calibration.padded([r["member_probs"][m] for r in rows]) for m in range(len(rows[0]["member_probs"]))]
    return calibration.padded([r["probs"] for r in rows]), np.array([r["gold"] for r in rows]), members


def figures(probs: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    found = calibration.of(probs, gold)
    return {"log_loss": found.log_loss, "calibration_error": found.calibration_error,
            "mean_confidence": found.mean_confidence, "accuracy": float((probs.argmax(axis=1) == gold).mean())}


def cross_fitted(probs: np.ndarray, gold: np.ndarray, folds: int, repeats: int, seed: int) -> dict[str, Any]:
    """Plain and scaled figures on held-out parts of one split, averaged over parts and splittings."""
    rng = np.random.default_rng(seed)
    plain, scaled, temperatures = [], [], []
    for _ in range(repeats):
        parts = np.array_split(rng.permutation(len(gold)), folds)
        for k, held in enumerate(parts):
            fit = np.concatenate([p for j, p in enumerate(parts) if j != k])
            temperature = calibration.fit_temperature(probs[fit], gold[fit])
            temperatures.append(temperature)
            plain.append(figures(probs[held], gold[held]))
            scaled.append(figures(calibration.scaled(probs[held], temperature), gold[held]))
    mean = lambda rows: {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}  # noqa: E731
    return {"plain": mean(plain), "scaled": mean(scaled), "temperature_mean": float(np.mean(temperatures)),
            "temperature_range": [float(min(temperatures)), float(max(temperatures))],
            "folds": folds, "repeats": repeats, "questions": int(len(gold))}


def mean_of(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The members' cross-fitted figures, averaged over the members."""
    return {side: {k: float(np.mean([f[side][k] for f in found])) for k in found[0][side]}
            for side in ("plain", "scaled")} | {"temperature_mean": float(np.mean([f["temperature_mean"] for f in found]))}


def measure(folder: Path, folds: int, repeats: int, seed: int) -> dict[str, Any]:
    if not (folder / "predictions.parquet").is_file():
        raise SystemExit(f"{folder}: no predictions.parquet; give a folder that `iaa-cli ensemble` wrote")
    table = pq.read_table(folder / "predictions.parquet")
    valid = split_of(table, "valid")
    if valid is None:
        raise SystemExit(f"{folder}/predictions.parquet holds no valid questions")
    probs, gold, members = valid
    out: dict[str, Any] = {"ensemble": str(folder), "members": len(members),
                           "temperature_on_all_valid": calibration.fit_temperature(probs, gold),
                           "valid_cross_fitted": cross_fitted(probs, gold, folds, repeats, seed),
                           "valid_members_mean": {k: float(np.mean([figures(m, gold)[k] for m in members]))
                                                  for k in ("log_loss", "calibration_error", "accuracy")},
                           "valid_members_cross_fitted": mean_of([cross_fitted(m, gold, folds, repeats, seed)
                                                                  for m in members])}
    test = split_of(table, "test")
    if test is not None:
        test_probs, test_gold, _ = test
        out["test"] = {"plain": figures(test_probs, test_gold),
                       "scaled": figures(calibration.scaled(test_probs, out["temperature_on_all_valid"]), test_gold)}
    return out


def line(found: dict[str, Any]) -> str:
    cross, members = found["valid_cross_fitted"], found["valid_members_cross_fitted"]
    plain, scaled = cross["plain"], cross["scaled"]
    count = f"{found['members']} member{'s' if found['members'] != 1 else ''}"
    return (f"{found['ensemble']}: {count}, valid {plain['accuracy']:.4f} "
            f"(members {found['valid_members_mean']['accuracy']:.4f}); T {found['temperature_on_all_valid']:.3f} "
            f"on all of valid ({cross['temperature_range'][0]:.3f}-{cross['temperature_range'][1]:.3f} on its parts); "
            f"held out: calibration error {100 * plain['calibration_error']:.2f} -> "
            f"{100 * scaled['calibration_error']:.2f} points (members "
            f"{100 * found['valid_members_mean']['calibration_error']:.2f}), log-loss {plain['log_loss']:.4f} -> "
            f"{scaled['log_loss']:.4f}; a member at its own T (mean {members['temperature_mean']:.3f}): "
            f"{100 * members['plain']['calibration_error']:.2f} -> {100 * members['scaled']['calibration_error']:.2f} "
            f"points, log-loss {members['plain']['log_loss']:.4f} -> {members['scaled']['log_loss']:.4f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ensembles", nargs="+", type=Path, help="Folders written by `iaa-cli ensemble`.")
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="Also write the figures here as JSON.")
    a = p.parse_args(argv)
    found = [measure(folder, a.folds, a.repeats, a.seed) for folder in a.ensembles]
    for f in found:
        print(line(f))
    if a.out:
        a.out.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
