"""``iaa-cli serve``: answer ``predict``'s questions over HTTP, many requests to one model call.

The workflow, without the server:

- :class:`ModelSource` names what a replica loads: a registered or logged MLflow model
  (``models:/NAME/VERSION``), a checkpoint, or an ``iaa-cli ensemble`` folder.
- :func:`parse` checks one request body and turns it into questions, or raises
  :class:`RequestError` with the HTTP status: 400 for malformed JSON, a missing field or a wrong
  type (naming the field), 413 for a document or a body over the :class:`Limits`, 422 for a
  question the reader cannot answer (no candidate in the document, no placeholder). Every check
  that could fail a question happens here, per request, so a batch never holds a bad question.
- :class:`Answerer` holds the loaded :class:`~iaa.jobs.inference.predict.Predictor` and answers a batch of
  requests with one pass of the same code as ``iaa-cli predict``; each row is ``predict``'s
  ``{"id", "prediction", "probs"[, "correct"]}`` plus the model's ``{"name", "version"}``.

``iaa.platform.ray_serve`` runs it on Ray Serve: replicas, ``serve.batch``, HTTP.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from iaa.errors import IaaError
from iaa.jobs.ports import Limits, LoadedModel, ModelFetcher, ModelSource, RequestError, ServeConfig
from iaa.jobs.workdir.paths import Workdir
from iaa.jobs.inference.raw_text import InputError, Question, from_record, present_candidate


def config(*, model_uri: str | None, checkpoint: Path | None, ensemble_dir: Path | None, data_dir: Path | None,
           workdir: Path, tracking_uri: str | None, max_document_words: int = Limits.max_document_words,
           **deploy: Any) -> ServeConfig:
    """The config of ``iaa-cli serve``'s flags. Paths are made absolute (replicas run in other
    processes); a ``models:/`` URI is read from ``tracking_uri``, else the workdir's SQLite store."""
    workdir = Path(workdir).resolve()
    if model_uri is not None:
        uri = Workdir(workdir).tracking_uri(tracking_uri)
        source = ModelSource("model", model_uri, workdir=str(workdir), tracking_uri=uri)
    else:
        kind, ref = ("checkpoint", checkpoint) if checkpoint is not None else ("ensemble", ensemble_dir)
        source = ModelSource(kind, str(Path(ref).resolve()), str(Path(data_dir).resolve()) if data_dir else None,
                             str(workdir))
    return ServeConfig(source, limits=Limits(max_document_words=max_document_words), **deploy)


# --- requests ------------------------------------------------------------------------------------


def parse(body: bytes, placeholder: str, lowercase: bool, limits: Limits = Limits()) -> tuple[list[Question], bool]:
    """The questions of one request body, and whether it was a single object (not a list).

    Raises:
        RequestError: 400, 413 or 422, with a message naming the field (``[2].candidates``).
    """
    if len(body) > limits.max_request_bytes:
        raise RequestError(413, f"request: {len(body)} bytes, over the limit of {limits.max_request_bytes}")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(400, f"request: not valid JSON ({getattr(err, 'msg', err)})") from None
    single = isinstance(payload, dict)
    items = [payload] if single else payload
    if not isinstance(items, list) or not items:
        raise RequestError(400, 'request: expected a question object {"document", "query", "candidates"} '
                                "or a non-empty list of them")
    if len(items) > limits.max_questions:
        raise RequestError(413, f"request: {len(items)} questions, over the limit of {limits.max_questions}")
    questions = []
    for i, item in enumerate(items):
        where = "" if single else f"[{i}]."
        record = _checked(item, where, limits)
        if "id" not in record:
            record = {**record, "id": str(i + 1)}          # predict numbers them by line
        try:
            question = from_record(record, where[:-1] or "question", placeholder)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")        # some candidates absent: they get probability 0
                present_candidate(question, lowercase, placeholder)
        except InputError as err:
            raise RequestError(422, str(err)) from None
        questions.append(question)
    return questions, single


def _checked(item: Any, where: str, limits: Limits) -> dict[str, Any]:
    """``item`` as a record ``from_record`` takes, each field's type checked (400 naming it)."""
    if not isinstance(item, dict):
        raise RequestError(400, f"{where[:-1] or 'request'}: expected a JSON object with document, query, candidates")
    for name in ("document", "query", "candidates"):
        if name not in item or item[name] is None:
            raise RequestError(400, f"{where}{name}: missing (a question needs document, query and candidates)")
    for name in ("document", "query"):
        if not isinstance(item[name], str):
            raise RequestError(400, f"{where}{name}: expected a string, got {_type(item[name])}")
    cands = item["candidates"]
    if isinstance(cands, list):
        for j, cand in enumerate(cands):
            if not isinstance(cand, str):
                raise RequestError(400, f"{where}candidates[{j}]: expected a string, got {_type(cand)}")
    elif not isinstance(cands, str):
        raise RequestError(400, f"{where}candidates: expected a list of strings, got {_type(cands)}")
    if "id" in item and (isinstance(item["id"], bool) or not isinstance(item["id"], (str, int))):
        raise RequestError(400, f"{where}id: expected a string or an integer, got {_type(item['id'])}")
    if item.get("answer") is not None and not isinstance(item["answer"], str):
        raise RequestError(400, f"{where}answer: expected a string, got {_type(item['answer'])}")
    words = len(item["document"].split())
    if words > limits.max_document_words:
        raise RequestError(413, f"{where}document: {words} words, over the limit of {limits.max_document_words}")
    return item


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


# --- answering ----------------------------------------------------------------------------------


def locate(source: ModelSource, fetch_model: ModelFetcher | None = None) -> LoadedModel:
    """The files of ``source``; an MLflow URI goes through ``fetch_model`` (the MLflow adapter)."""
    from iaa.jobs.inference import predict

    if source.kind == "model":
        if fetch_model is None:
            raise IaaError("serving an MLflow model needs the MLflow adapter")
        return fetch_model(source.ref, source.tracking_uri)
    ref = Path(source.ref)
    if source.kind == "checkpoint":
        checkpoints = [ref]
        name = ref.parent.parent.name if ref.parent.name == "checkpoints" else ref.stem
        digest = _digest(ref)
    else:
        checkpoints = predict.ensemble_members(ref)
        name, digest = ref.resolve().name, _digest(ref / "ensemble.json")
    data_dir = Path(source.data_dir) if source.data_dir else None
    return LoadedModel(tuple(checkpoints), data_dir, name, digest)


def _digest(path: Path) -> str:
    """A content version for files that have no registry version: the first 12 hex of sha256."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


class Answerer:
    """One replica's model: answers batches of parsed requests."""

    def __init__(self, predictor: Any, name: str, version: str) -> None:
        self.predictor, self.name, self.version = predictor, name, version
        self.model = {"name": name, "version": version}
        self.load_seconds: float | None = None       # fetch, load and warm-up, when made by :meth:`load`

    @classmethod
    def load(cls, source: ModelSource, threads: int = 1, fetch_model: ModelFetcher | None = None) -> "Answerer":
        """Load ``source`` and answer one question, so the first request finds a warm model."""
        import torch

        from iaa.jobs.inference.predict import Predictor

        started = time.perf_counter()
        torch.set_num_threads(max(1, threads))
        found = locate(source, fetch_model)
        answerer = cls(Predictor.load(found.checkpoints, found.data_dir), found.name, found.version)
        answerer.warm_up()
        answerer.load_seconds = time.perf_counter() - started
        return answerer

    @property
    def placeholder(self) -> str:
        return self.predictor.vocab.placeholder

    @property
    def lowercase(self) -> bool:
        return self.predictor.lowercase

    def parse(self, body: bytes, limits: Limits = Limits()) -> tuple[list[Question], bool]:
        return parse(body, self.placeholder, self.lowercase, limits)

    def warm_up(self) -> None:
        record = {"id": "warm-up", "document": "a b c", "query": f"{self.placeholder} b", "candidates": ["a", "c"]}
        self.answer([[from_record(record, "warm-up", self.placeholder)]])

    def answer(self, requests: Sequence[Sequence[Question]]) -> list[list[dict[str, Any]]]:
        """``predict``'s rows for each request's questions, from one pass over all of them."""
        flat = [q for questions in requests for q in questions]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")            # absent candidates: probability 0, as predict says
            rows = self.predictor.predict(flat)
        out, start = [], 0
        for questions in requests:
            out.append([{**row, "model": self.model} for row in rows[start:start + len(questions)]])
            start += len(questions)
        return out
