"""The serving port: the serve job's code that a serving adapter runs
(:mod:`iaa.platform.ray_serve`), and what a replica holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from iaa.jobs.ports.records import Limits, LoadedModel, ModelSource, ServeApi

if TYPE_CHECKING:
    from iaa.data.formats.raw_text import Question


@dataclass(frozen=True)
class ServeCode:
    """The serve job's code that the Serve adapter runs (module-level callables, pickled by
    reference): ``load(source, threads=, fetch_model=)`` builds a reader replica's warmed-up
    answerer; ``parse(body, placeholder, lowercase, limits)`` checks one request body and returns
    ``(questions, single)`` or raises :class:`RequestError` (the ingress runs it, so a batch only
    computes); ``api(placeholder)`` describes the API for a model whose queries mark the word to
    fill in with ``placeholder`` (``XXXXX``, ``@placeholder``), for the OpenAPI document."""

    load: "ServeLoader"
    parse: Callable[[bytes, str, bool, Limits], "tuple[list[Question], bool]"]
    api: Callable[[str], ServeApi]


class ServedModel(Protocol):
    """What a reader replica holds: the loaded model, its names, and its answers to checked questions."""

    name: str
    version: str
    model: str
    load_seconds: float | None
    placeholder: str
    lowercase: bool

    def answer(self, requests: "Sequence[Sequence[Question]]") -> list[list[dict[str, object]] | Exception]: ...


class ServeLoader(Protocol):
    """Builds a reader replica's warmed-up answerer from ``source`` with ``threads`` torch threads;
    ``fetch_model`` brings a logged model's files from MLflow."""

    def __call__(self, source: ModelSource, threads: int = 1,
                 fetch_model: "ModelFetcher | None" = None) -> ServedModel: ...


ModelFetcher = Callable[[str, "str | None"], LoadedModel]    # (MLflow URI, tracking URI) -> files
