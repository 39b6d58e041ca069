"""``iaa-cli predict``: answer cloze questions given as raw text (or CBT / CNN files) with a
checkpoint or a seed ensemble; the same ``probs`` as ``iaa-cli evaluate`` writes.

A checkpoint carries its vocabulary (:func:`iaa.jobs.training.checkpoint.vocabulary`), so it answers from
any folder; an older one without it needs the prepared folder it was trained on.

An ensemble's distribution is the mean of its members' candidate probabilities, as in
``iaa.jobs.ensembles.averaging``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from torch import nn

from iaa.data.vocab import Vocab
from iaa.errors import IaaError
from iaa.jobs.training import checkpoint
from iaa.jobs.training import precision_policy as precision_lib
from iaa.jobs.ports import ModelCode
from iaa.jobs.inference.raw_text import Question, from_record, read_input, to_rows

BATCH_SIZE = 32
SUMMARY = "ensemble.json"   # what `iaa-cli ensemble` writes into its folder


@dataclass(frozen=True)
class Predictor:
    """Readers that share one vocabulary, and how their dataset tokenises."""

    models: tuple[nn.Module, ...]
    vocab: Vocab
    lowercase: bool
    precision: str = "fp32"    # what the readers multiply in: fp32 | bf16

    @classmethod
    def load(cls, checkpoints: Sequence[Path], data_dir: Path | None = None, precision: str = "auto") -> "Predictor":
        """Rebuild each checkpoint, computing in ``precision`` (auto | fp32 | bf16, resolved here:
        ``iaa.jobs.training.precision_policy``), with the vocabulary of ``data_dir`` or else the
        one the first checkpoint carries; refuse a member trained on another vocabulary."""
        from iaa.data.loader import PreparedData

        used = precision_lib.resolve(precision)
        loaded = [(Path(path), *checkpoint.load_model(Path(path), precision=used)) for path in checkpoints]
        if data_dir is not None:
            data = PreparedData.open(Path(data_dir))
            vocab, lowercase = data.vocab, bool(data.manifest.get("options", {}).get("lowercase", False))
            vocab_hash, source = data.manifest.get("vocab_hash", ""), str(data_dir)
        else:
            first, _, _, state = loaded[0]
            carried = checkpoint.vocabulary(state, first)
            if carried is None:
                raise IaaError(f"{first} carries no vocabulary (it was written by an older version): pass the "
                               "prepared folder it was trained on with --data or --dataset")
            (vocab, lowercase), vocab_hash, source = carried, state.get("vocab_hash", ""), str(first)
        for path, _, _, state in loaded:
            checkpoint.check_vocab(state, vocab_hash, path, source, "an ensemble's members and the data must share one "
                                   "vocabulary; pass the prepared folder it was trained on with --data")
        return cls(tuple(model for _, model, _, _ in loaded), vocab, lowercase, used)

    def predict(self, questions: Sequence[Question]) -> list[dict[str, Any]]:
        """One ``{"id", "prediction", "probs": {candidate: p}[, "correct"]}`` per question, in order."""
        import torch

        from iaa.data.loader import collate
        from iaa.model.pointer import candidate_probs

        if not questions:
            return []
        table = to_rows(questions, self.vocab, self.lowercase)
        out = []
        with torch.no_grad():
            for start in range(0, len(questions), BATCH_SIZE):
                batch = collate(table.slice(start, BATCH_SIZE))
                probs = torch.stack([candidate_probs(m.eval()(batch)) for m in self.models]).mean(0)  # (B, C)
                for b, q in enumerate(questions[start:start + BATCH_SIZE]):
                    out.append(_answer(q, probs[b, :len(q.example.candidates)].tolist()))
        return out

    def predict_records(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """:meth:`predict` on question records (predict's JSON objects), named ``row N`` in errors."""
        placeholder = self.vocab.placeholder
        return self.predict([from_record(r, f"row {i}", placeholder) for i, r in enumerate(records, 1)])


# What a logged model runs of this job: how it reads checkpoints and rebuilds the predictor.
MODEL_CODE = ModelCode(read=checkpoint.load, load=Predictor.load, write=checkpoint.save)


def _answer(q: Question, probs: list[float]) -> dict[str, Any]:
    cands = q.example.candidates
    best = max(range(len(cands)), key=probs.__getitem__)
    row: dict[str, Any] = {"id": q.example.example_id, "prediction": cands[best],
                           "probs": {c: p for c, p in zip(cands, probs)}}
    if q.gold is not None:
        row["correct"] = cands[best] == q.gold
    return row


def ensemble_members(ensemble_dir: Path) -> list[Path]:
    """The selected members' checkpoints of an ``iaa-cli ensemble`` output folder.

    Members are absolute paths, each checked against the sha256 that ``ensemble.json`` recorded
    for it (an ensemble written before digests were recorded is read without that check); a
    relative path (it would depend on the current folder) or a changed member is refused.
    """
    summary = Path(ensemble_dir) / SUMMARY
    if not summary.is_file():
        raise IaaError(f"{ensemble_dir} holds no {SUMMARY}: give the folder `iaa-cli ensemble` wrote")
    try:
        record = json.loads(summary.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise IaaError(f"{summary}: not valid JSON ({err}); re-run `iaa-cli ensemble` to write it again") from None
    members = record.get("members") if isinstance(record, dict) else None
    if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
        raise IaaError(f"{summary}: 'members' must be a list of checkpoint paths; re-run `iaa-cli ensemble`")
    if not members:
        raise IaaError(f"{summary} lists no members")
    digests = record.get("member_sha256") or {}
    for member in members:
        if not Path(member).is_absolute():
            raise IaaError(f"{summary}: member {member} is a relative path, which would depend on the current "
                           "folder; re-run `iaa-cli ensemble` to record absolute paths and digests")
        if not isinstance(digests, dict) or (digests and member not in digests):
            raise IaaError(f"{summary}: no sha256 recorded for member {member}; re-run `iaa-cli ensemble`")
    from iaa.data.shards import file_sha256

    for member in members:
        if not Path(member).is_file():
            raise IaaError(f"{summary}: member {member} is missing; re-run `iaa-cli ensemble`")
        if digests and file_sha256(Path(member)) != digests[member]:
            raise IaaError(f"{member}: changed since the ensemble {ensemble_dir} was made (its sha256 differs "
                           f"from the one in {SUMMARY}); re-run `iaa-cli ensemble` with the members you mean")
    return [Path(m) for m in members]


def run(input_path: Path, out: Path, *, checkpoint: Path | None = None, ensemble_dir: Path | None = None,
        data_dir: Path | None = None, precision: str = "auto") -> dict[str, Any]:
    """Predict every question of ``input_path`` with ``checkpoint`` or the members of
    ``ensemble_dir`` and write JSON Lines to ``out``; ``data_dir``: the prepared folder whose
    vocabulary to use (default: the one the checkpoints carry); ``precision``: auto | fp32 | bf16.
    ``out`` may not replace an input, nor a file of the ensemble.
    """
    import warnings

    from iaa.files import atomic_write_text
    from iaa.jobs.workdir import outputs
    from iaa.jobs.inference.raw_text import JSONL_SUFFIXES

    checkpoints = [Path(checkpoint)] if checkpoint is not None else ensemble_members(Path(ensemble_dir))
    to_stdout = str(out) == "-"
    if not to_stdout:
        outputs.check_file_output(out, suffixes=JSONL_SUFFIXES, what="JSON Lines", inputs={
            "the input": input_path, "a checkpoint": checkpoints,
            "a file of the prepared data": outputs.data_files(data_dir),
            "a file of the ensemble": outputs.data_files(ensemble_dir)})
    predictor = Predictor.load(checkpoints, data_dir, precision)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = predictor.predict(read_input(Path(input_path), predictor.vocab.placeholder))
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if to_stdout:
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        atomic_write_text(out, lines)
    scored = [r["correct"] for r in rows if "correct" in r]
    return {"predictions": "stdout" if to_stdout else str(out), "examples": len(rows), "members": len(checkpoints),
            "accuracy": sum(scored) / len(scored) if scored else None,
            "warnings": [str(w.message) for w in caught], "precision": predictor.precision}
