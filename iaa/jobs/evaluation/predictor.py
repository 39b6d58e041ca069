"""The predictor: readers rebuilt from checkpoints (one, or a seed ensemble's members) that answer
cloze questions given as raw text (or CBT / CNN files); the same ``probs`` as ``iaa-cli evaluate`` writes.

A checkpoint carries its vocabulary (:func:`iaa.jobs.modeling.checkpoint.vocabulary`), so it answers from
any folder; an older one without it needs the prepared folder it was trained on.

A reader alone answers at the temperature its checkpoint holds (fitted on valid while it
trained: :func:`iaa.jobs.modeling.checkpoint.temperature`). An ensemble's distribution is the
mean of its members' plain candidate probabilities, as in ``iaa.jobs.evaluation.ensembling.averaging``, at
the temperature the ensemble was calibrated to (:func:`iaa.jobs.evaluation.calibration.scaled`;
1.0 leaves it as averaged).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import nn

from iaa.data.prepared.vocab import Vocab
from iaa.errors import IaaError
from iaa.jobs.evaluation import calibration, unknowns
from iaa.jobs.modeling import checkpoint
from iaa.jobs.modeling import precision_policy as precision_lib
from iaa.jobs.ports import ModelCode
from iaa.data.formats.raw_text import Question, from_record, to_rows
from iaa.jobs.evaluation.ensembling.ensemble_record import SUMMARY, members as ensemble_members  # noqa: F401 - the readers' names
from iaa.jobs.evaluation.ensembling.ensemble_record import temperature as ensemble_temperature  # noqa: F401

BATCH_SIZE = 32


@dataclass(frozen=True)
class Predictor:
    """Readers that share one vocabulary, and how their dataset tokenises."""

    models: tuple[nn.Module, ...]
    vocab: Vocab
    lowercase: bool
    precision: str = "fp32"    # what the readers multiply in: fp32 | bf16
    temperature: float = 1.0   # the averaged distributions are scaled by it (fitted on valid)

    @classmethod
    def load(cls, checkpoints: Sequence[Path], data_dir: Path | None = None, precision: str = "auto",
             temperature: float | None = None) -> "Predictor":
        """Rebuild each checkpoint, computing in ``precision`` (auto | fp32 | bf16, resolved here:
        ``iaa.jobs.modeling.precision_policy``), with the vocabulary of ``data_dir`` or else the
        one the first checkpoint carries; refuse a member trained on another vocabulary.
        ``temperature``: what the averaged distributions are scaled by (an ensemble's); None:
        the one checkpoint's own, 1.0 for several."""
        from iaa.data.loading.loader import PreparedData

        used = precision_lib.resolve(precision)
        loaded = [(Path(path), *checkpoint.load_model(Path(path), precision=used)) for path in checkpoints]
        if data_dir is not None:
            data = PreparedData.open(Path(data_dir))
            vocab, lowercase = data.vocab, data.manifest.lowercase
            vocab_hash, source = data.manifest.vocab_hash, str(data_dir)
        else:
            first, _, _, state = loaded[0]
            carried = checkpoint.vocabulary(state, first)
            if carried is None:
                raise IaaError(f"{first} carries no vocabulary (it was written by an older version): pass the "
                               "prepared folder it was trained on with `data` or `dataset`")
            (vocab, lowercase), vocab_hash, source = carried, state.get("vocab_hash", ""), str(first)
        for path, _, _, state in loaded:
            checkpoint.check_vocab(state, vocab_hash, path, source, "an ensemble's members and the data must share one "
                                   "vocabulary; pass the prepared folder it was trained on with `data`")
        if temperature is None:
            temperature = checkpoint.temperature(loaded[0][3]) if len(loaded) == 1 else 1.0
        return cls(tuple(model for _, model, _, _ in loaded), vocab, lowercase, used, temperature)

    def predict(self, questions: Sequence[Question],
                progress: Callable[[int], Any] | None = None) -> list[dict[str, Any]]:
        """One ``{"id", "prediction", "probs": {candidate: p}[, "correct"], "absent_candidates",
        "unknown_share", "unknown_candidates"[, "warning"]}`` per question, in order:
        ``absent_candidates`` those that never occur in the document (probability 0: the reader
        points at document words), ``warning`` when the document is mostly ``<unk>``
        (:mod:`iaa.jobs.evaluation.unknowns`). ``progress`` is called with each batch's number of
        questions once it is answered."""
        import torch

        from iaa.data.loading.loader import collate
        from iaa.model.pointer import candidate_probs

        if not questions:
            return []
        table = to_rows(questions, self.vocab, self.lowercase)
        gaps = unknowns.of_table(table)
        absent = _absent_candidates(table)
        out = []
        with torch.no_grad():
            for start in range(0, len(questions), BATCH_SIZE):
                batch = collate(table.slice(start, BATCH_SIZE))
                probs = torch.stack([candidate_probs(m.eval()(batch).log_probs) for m in self.models]).mean(0)  # (B, C)
                probs = calibration.scaled(probs.double().numpy(), self.temperature)
                for b, q in enumerate(questions[start:start + BATCH_SIZE]):
                    row = _answer(q, probs[b, :len(q.example.candidates)].tolist())
                    out.append({**row, "absent_candidates": [q.example.candidates[i] for i in absent[start + b]]})
                if progress is not None:
                    progress(probs.shape[0])
        return [unknowns.annotated(row, gap) for row, gap in zip(out, gaps)]

    def baseline(self, questions: Sequence[Question]) -> float | None:
        """The most-frequent-candidate accuracy (:mod:`iaa.jobs.evaluation.frequency`) over the
        questions that give an answer, their documents read as :meth:`predict` reads them; None
        where none gives one."""
        import warnings

        from iaa.data.formats.raw_text import labelled_rows
        from iaa.jobs.evaluation import frequency

        answered = [q for q in questions if q.gold is not None]
        if not answered:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # what reading them warns about, predict has said
            table = labelled_rows(answered, self.vocab, self.lowercase, need_answers=True)
        return frequency.of_table(table)

    def predict_records(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """:meth:`predict` on question records (predict's JSON objects), named ``row N`` in errors."""
        placeholder = self.vocab.placeholder
        return self.predict([from_record(r, f"row {i}", placeholder) for i, r in enumerate(records, 1)])


# How logging a model reads its checkpoints and writes their inference-only members; the model
# rebuilds its predictor with Predictor.load (iaa.cli.logged_model names it).
MODEL_CODE = ModelCode(read=checkpoint.load, write=checkpoint.save)


def _absent_candidates(table: Any) -> list[list[int]]:
    """Each row's candidates (their indices) that no document word matches: ``doc_cand`` never names them."""
    pointed = (set(doc_cand) for doc_cand in table.column("doc_cand").to_pylist())
    return [[i for i in range(len(cands)) if i not in seen]
            for seen, cands in zip(pointed, table.column("candidates").to_pylist())]


def _answer(q: Question, probs: list[float]) -> dict[str, Any]:
    cands = q.example.candidates
    best = max(range(len(cands)), key=probs.__getitem__)
    row: dict[str, Any] = {"id": q.example.example_id, "prediction": cands[best],
                           "probs": {c: p for c, p in zip(cands, probs)}}
    if q.gold is not None:
        row["correct"] = cands[best] == q.gold
    return row
