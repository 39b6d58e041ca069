"""``iaa-cli serve``: answer ``predict``'s questions over HTTP, many requests to one model call.

The workflow, without the server:

- :class:`ModelSource` names what a replica loads: a registered or logged MLflow model
  (``models:/NAME/VERSION``), a checkpoint, or an ``iaa-cli ensemble`` folder.
- :func:`parse` checks one request body and turns it into questions, or raises
  :class:`RequestError` with the HTTP status: 400 for malformed JSON (nested too deeply, a
  number of too many digits), a missing field, a wrong type or text that is not Unicode (naming
  the field, checked against the pydantic model :class:`QuestionIn`), 413 for a document, a
  query, a candidate list or a body over the :class:`Limits`, 422 for a question the reader
  cannot answer (no candidate in the document, no placeholder or two, a candidate listed twice,
  an empty or blank candidate, a candidate of several words: the reader points at single words).
  Every check that could fail a question happens here, per request (the serve ingress runs it),
  so a batch never holds a bad question.
- :class:`Answerer` holds the loaded :class:`~iaa.jobs.evaluation.predictor.Predictor` and answers a batch of
  requests with one pass of the same code as ``iaa-cli predict``; each row is ``predict``'s
  ``{"id", "prediction", "probs"[, "correct"], "absent_candidates", "unknown_share", "unknown_candidates"[,
  "warning"]}`` (the candidates not in the document, the share of the document outside the
  vocabulary, the unknown candidates, and a warning above
  :data:`~iaa.jobs.evaluation.unknowns.UNKNOWN_WARN_SHARE`) plus the model's ``{"name", "version"}``.
  Should the model still fail on one request of a batch, only that request fails.

``iaa.platform.ray_serve`` runs it on Ray Serve: replicas, ``serve.batch``, HTTP.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from pathlib import Path
from typing import Annotated, Any, Sequence

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from iaa.errors import IaaError
from iaa.jobs.ports import (Limits, LoadedModel, ModelFetcher, ModelSource, RequestError, ServeApi, ServeCode,
                            ServeConfig)
from iaa.jobs.workdir.paths import ENSEMBLE_RECORD, Workdir
from iaa.data.formats.raw_text import InputError, LongNumber, Question, assembled, from_record, loads, text_problem


def config(*, model_uri: str | None, checkpoint: Path | None, ensemble_dir: Path | None, data_dir: Path | None,
           workdir: Path, tracking_uri: str | None, max_document_words: int = Limits.max_document_words,
           max_query_words: int = Limits.max_query_words, max_candidates: int = Limits.max_candidates,
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
    limits = Limits(max_document_words=max_document_words, max_query_words=max_query_words,
                    max_candidates=max_candidates)
    return ServeConfig(source, limits=limits, **deploy)


def check_source(source: ModelSource) -> None:
    """Refuse a checkpoint or an ensemble that no replica could load, before a cluster starts for
    it: a file that is no checkpoint, an ensemble folder without its record, a member missing or
    changed. (A logged model is fetched by the replicas.)

    Raises:
        IaaError: naming the file and what is wrong.
    """
    from iaa.jobs.evaluation import predictor
    from iaa.jobs.modeling import checkpoint

    if source.kind == "checkpoint":
        checkpoint.load(Path(source.ref))
    elif source.kind == "ensemble":
        predictor.ensemble_members(Path(source.ref))         # its record read, each member there and unchanged


# --- requests ------------------------------------------------------------------------------------


def _unicode(value: str) -> str:
    if problem := text_problem(value):
        raise ValueError(problem)
    return value


Text = Annotated[str, AfterValidator(_unicode)]


class QuestionIn(BaseModel):
    """One question of ``POST /predict``: ``iaa-cli predict``'s JSON Lines record. A null ``id`` or
    ``answer`` is the same as none."""

    model_config = ConfigDict(strict=True, extra="ignore", title="Question")

    document: Text = Field(description="the text to read; split on whitespace")
    query: Text = Field(description="the text with one placeholder word to fill in")
    candidates: list[Text] | Text = Field(description="the words to choose from, each one word of the document: "
                                                      "a list, or one string of |- or space-separated words")
    id: Text | int | None = Field(None, description="default: the question's place in the request, 1, 2, ...")
    answer: Text | None = Field(None, description="the gold candidate, if known: rows then say whether it was chosen")


class ModelOut(BaseModel):
    """The served model: its name and version."""

    name: str
    version: str


class AnswerOut(BaseModel):
    """One answered question: ``iaa-cli predict``'s row and the model that answered."""

    model_config = ConfigDict(title="Answer")

    id: str = Field(description="the question's id, or its place in the request (1, 2, ...)")
    prediction: str = Field(description="the candidate the reader chose")
    probs: dict[str, float] = Field(description="each candidate's probability (a reader's, or an ensemble's "
                                                "average, at the temperature fitted to the valid split)")
    correct: bool | None = Field(None, description="whether the prediction is the answer, when the question gave one")
    absent_candidates: list[str] = Field(description="the candidates that never occur in the document: the reader "
                                                     "points at document words, so they get probability 0")
    unknown_share: float = Field(description="the share of the document outside the model's vocabulary, 0 to 1")
    unknown_candidates: list[str] = Field(description="the candidates outside the model's vocabulary")
    warning: str | None = Field(None, description="when most of the document is unknown to the model")
    model: ModelOut


QUESTIONS = TypeAdapter(list[QuestionIn])
_REF = "#/components/schemas/{model}"
_EXPECTED = {"document": "a string", "query": "a string", "candidates": "a list of strings", "answer": "a string",
             "id": "a string or an integer"}


def example(placeholder: str) -> dict[str, Any]:
    """A question that a model whose queries mark the missing word with ``placeholder`` answers."""
    return {"id": "q1", "document": "Tara smiled . at dawn , Gina walked to the shop . Rosa played with Hank .",
            "query": f"one evening , {placeholder} was seen near the shop .",
            "candidates": ["Gina", "Rosa", "Tara", "Hank"], "answer": "Gina"}


def api(placeholder: str) -> ServeApi:
    """``POST /predict`` as JSON schema for a model whose placeholder is ``placeholder``: the
    request body (one question, or a non-empty list of them) with examples that model answers,
    and the answer (a row, or a list of rows)."""
    one = example(placeholder)
    request = TypeAdapter(QuestionIn | list[QuestionIn]).json_schema(ref_template=_REF)
    answer = TypeAdapter(AnswerOut | list[AnswerOut]).json_schema(ref_template=_REF)
    definitions = {**request.pop("$defs", {}), **answer.pop("$defs", {})}
    question = definitions["QuestionIn"]
    query = f"the text, with the one word to fill in written as {placeholder} (this model's placeholder)"
    question["properties"]["query"]["description"] = query
    for name, value in one.items():
        question["properties"][name]["examples"] = [value]
    question["examples"] = [one]
    rest = {k: v for k, v in one.items() if k not in ("id", "answer")}
    examples = {"one question": one,
                "a list of questions, ids by place": [rest, {**rest, "query": f"{placeholder} smiled ."}],
                "null id and answer (as none)": {**rest, "id": None, "answer": None}}
    return ServeApi(request=request, examples=examples, answer=answer, definitions=definitions)


def parse(body: bytes, placeholder: str, lowercase: bool, limits: Limits = Limits()) -> tuple[list[Question], bool]:
    """The questions of one request body, and whether it was a single object (not a list): every
    check that can fail one question runs here, so a batch of parsed requests only computes.

    Raises:
        RequestError: 400 (not JSON, a wrong type, text that is not Unicode), 413 (over a limit of
            ``limits``) or 422 (a question the reader cannot answer), naming the field (``[2].candidates``).
    """
    if len(body) > limits.max_request_bytes:
        raise RequestError(413, f"request: {len(body)} bytes, over the limit of {limits.max_request_bytes}")
    try:
        payload = loads(body, "request")
    except InputError as err:
        raise RequestError(400, str(err)) from None
    single = isinstance(payload, dict)
    items = [payload] if single else payload
    if not isinstance(items, list) or not items:
        raise RequestError(400, 'request: expected a question object {"document", "query", "candidates"} '
                                "or a non-empty list of them")
    if len(items) > limits.max_questions:
        raise RequestError(413, f"request: {len(items)} questions, over the limit of {limits.max_questions}")
    try:
        QUESTIONS.validate_python(items)
    except ValidationError as err:
        raise RequestError(400, _field_error(err, single)) from None
    questions: list[Question] = []
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        where = "" if single else f"[{i + 1}]."        # counted from 1, as the ids are
        _within(item, where, limits)
        if item.get("id") is None:
            item = {**item, "id": str(i + 1)}          # predict numbers them by line
        try:
            question = from_record(item, where[:-1] or "question", placeholder)
        except InputError as err:
            raise RequestError(422, str(err)) from None
        key = question.example.example_id
        if key in first:                               # as predict refuses them: answers are told apart by id
            raise RequestError(422, f"{where}id: {key!r} is also the id of [{first[key]}]; give every question "
                                    "its own id")
        first[key] = i + 1
        questions.append(question)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")            # some candidates absent: they get probability 0
            assembled(questions, placeholder, lowercase)
    except InputError as err:
        raise RequestError(422, str(err)) from None
    return questions, single


def _field_error(err: ValidationError, single: bool) -> str:
    """The first field pydantic refused, as ``[1].candidates[2]: expected a string, got a number``:
    the second candidate of the first question, counted from 1 as the ids are."""
    errors = err.errors()
    first = errors[0]["loc"][:2]
    error = max((e for e in errors if e["loc"][:2] == first), key=lambda e: (e["type"] == "missing", len(e["loc"])))
    index, rest = error["loc"][0], [part for part in error["loc"][1:] if part in _EXPECTED or isinstance(part, int)]
    path = ("" if single else f"[{index + 1}]") + "".join(f"[{p + 1}]" if isinstance(p, int) else f".{p}" for p in rest)
    path = path.lstrip(".") or ("request" if single else path)
    if error["type"] == "missing":
        return f"{path}: missing (a question needs document, query and candidates)"
    if not rest:
        return f"{path}: expected a JSON object with document, query, candidates"
    if error["type"] == "value_error":
        return f"{path} {error['ctx']['error']}"
    expected = "a string" if isinstance(rest[-1], int) else _EXPECTED[rest[-1]]
    return f"{path}: expected {expected}, got {_type(error['input'])}"


def _within(item: dict[str, Any], where: str, limits: Limits) -> None:
    """413 naming the field when the document, the query or the candidates are over ``limits``."""
    counts = [("document", len(item["document"].split()), "words", limits.max_document_words),
              ("query", len(item["query"].split()), "words", limits.max_query_words)]
    cands = item["candidates"]
    counts.append(("candidates", len(cands if isinstance(cands, list) else cands.split("|") if "|" in cands
                                     else cands.split()), "candidates", limits.max_candidates))
    for name, count, unit, limit in counts:
        if count > limit:
            raise RequestError(413, f"{where}{name}: {count} {unit}, over the limit of {limit}")


def _type(value: Any) -> str:
    if isinstance(value, LongNumber):
        return f"a number of {value.digits:,} digits"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


# --- answering ----------------------------------------------------------------------------------


def locate(source: ModelSource, fetch_model: ModelFetcher | None = None) -> LoadedModel:
    """The files of ``source``; an MLflow URI goes through ``fetch_model`` (the MLflow adapter)."""
    from iaa.jobs.evaluation import predictor

    if source.kind == "model":
        if fetch_model is None:
            raise IaaError("serving an MLflow model needs the MLflow adapter")
        return fetch_model(source.ref, source.tracking_uri)
    ref = Path(source.ref)
    if source.kind == "checkpoint":
        checkpoints, temperature = [ref], None
        name = ref.parent.parent.name if ref.parent.name == "checkpoints" else ref.stem
        digest = _digest(ref)
    else:
        checkpoints, temperature = predictor.ensemble_members(ref), predictor.ensemble_temperature(ref)
        name, digest = ref.resolve().name, _digest(ref / ENSEMBLE_RECORD)
    data_dir = Path(source.data_dir) if source.data_dir else None
    return LoadedModel(tuple(checkpoints), data_dir, name, digest, temperature)


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

        from iaa.jobs.evaluation.predictor import Predictor

        started = time.perf_counter()
        torch.set_num_threads(max(1, threads))
        found = locate(source, fetch_model)
        answerer = cls(Predictor.load(found.checkpoints, found.data_dir, temperature=found.temperature), found.name,
                       found.version)
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

    def answer(self, requests: Sequence[Sequence[Question]]) -> list[list[dict[str, Any]] | Exception]:
        """``predict``'s rows for each request's questions, from one pass over all of them. When
        that pass fails, each request is answered alone, so the failure is only the failing
        request's: its place holds the exception."""
        flat = [q for questions in requests for q in questions]
        try:
            rows = self._predict(flat)
        except Exception:  # noqa: BLE001 - find the request that fails, answer the others
            if len(requests) == 1:
                raise
            return [self._alone(questions) for questions in requests]
        out, start = [], 0
        for questions in requests:
            out.append([{**row, "model": self.model} for row in rows[start:start + len(questions)]])
            start += len(questions)
        return out

    def _alone(self, questions: Sequence[Question]) -> list[dict[str, Any]] | Exception:
        try:
            return [{**row, "model": self.model} for row in self._predict(questions)]
        except Exception as error:  # noqa: BLE001 - this request's failure, reported as its 500
            return error

    def _predict(self, questions: Sequence[Question]) -> list[dict[str, Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")            # absent candidates: probability 0, as predict says
            return self.predictor.predict(questions)


# What the Serve adapter runs of this job: the replicas' loader, the ingress's checks, the API's schema.
CODE = ServeCode(load=Answerer.load, parse=parse, api=api)
