"""The reader on Ray Serve: the only module that imports ``ray.serve``.

Two deployments. ``Reader`` replicas each hold the answerer that the job's ``code.load``
(:meth:`iaa.jobs.inference.serve.Answerer.load`) returns; ``Ingress``, a FastAPI app on
``@serve.ingress``, takes HTTP, checks each request and hands its questions to a reader:

- ``POST /predict`` takes ``iaa-cli predict``'s question object, or a list of them, and answers
  with its rows (an object, or a list), each carrying the model's name and version (also in the
  ``x-iaa-model`` and ``x-iaa-model-version`` headers, percent-encoded by :mod:`iaa.platform.serve_text`).
  Serve's proxy refuses a body over the byte limit before any replica sees it
  (:mod:`iaa.platform.serve_proxy`, set up by :func:`start`); the ingress reads the body up to the
  limit too (a chunked body included), for proxies without it, and runs the job's ``code.parse``
  on it (the pydantic model of a question, then every check that can fail one question); a reader then only computes,
  answering it in a batch: ``serve.batch`` gathers up to ``max_batch`` requests (waiting at most
  ``batch_wait_ms``) into one model call.
- ``GET /ready`` answers 200 once a reader has loaded the model and answered a warm-up question
  (a reader takes requests only after its constructor), else 503: within :data:`FIRST_WAIT_S`
  while no reader has answered yet, after :data:`READY_WAIT_S` once one has (the readers are
  busy, or being replaced). ``GET /`` adds the limits and
  the URLs of ``GET /docs`` and ``GET /openapi.json``, which describe the API for the served
  model (named in the title; the request body's examples, and the model's answers to them); the
  page's script and styles are served here too (:mod:`iaa.platform.serve_docs`), not from a CDN.
- On a local cluster, the gRPC server Serve starts in each replica listens on loopback, like
  the rest of the cluster (:func:`iaa.platform.cluster.ray_internals.bind_serve_replica_grpc`).
- A refused request is a 400/413/422 JSON ``{"error", "status"}``, and so is every other error
  of the app (an unknown path, 404; a method its path does not take, 405; a failure of the
  ingress itself, 500); should the model fail inside a batch, only the failing request gets a
  500, and never the replica. A request whose reader dies under it is sent to another reader.

:func:`build` makes the application; a Serve config (``deploy/serve.yaml``) names
:func:`iaa.cli.serve_app`, which hands it the job's code (:data:`iaa.jobs.inference.serve.CODE`).
"""

# No `from __future__ import annotations`: Serve pickles the ingress class by value, and FastAPI
# reads its routes' annotations (``request: Request``) in the replica, where a string would not resolve.
import asyncio
import functools
import re
import json
import logging
import os
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from ray import serve
from starlette.exceptions import HTTPException
from starlette.responses import Response

from iaa import __version__
from iaa.errors import IaaError
from iaa.jobs.ports import Limits, ModelSource, RequestError, ServeCode, ServeConfig
from iaa.platform import listeners, serve_life
from iaa.platform.cluster import ray_internals
from iaa.platform.serve_capacity import INGRESS_CPUS, check_fits, ingresses, wait_running
from iaa.platform.serve_docs import DOCS_URL, Index, Ready, add_docs, openapi_document, served_name
from iaa.platform.serve_logs import driver_lines_to_log
from iaa.platform.serve_proxy import over_limit, proxy_env
from iaa.platform.serve_text import log_text, model_headers

ROUTE = "/"
READY_WAIT_S = 5.0                 # GET /ready, /openapi.json: how long to wait for a busy reader before 503
FIRST_WAIT_S = 0.5                 # ... before any reader has answered (they are loading the model): 503 at once
OPENAPI_URL = "/openapi.json"


Reply = tuple[int, str, dict[str, str]]          # status, JSON text, headers

# GET /openapi.json is the ingress's own route: the document names the served model and its placeholder.
app = FastAPI(title="iaa reader", version=__version__, docs_url=None, redoc_url=None, openapi_url=None,
              description="Cloze questions answered by an Iterative Alternating Attention reader (`iaa-cli serve`). "
                          "Every error is a JSON {error, status}, an unknown path (404) or a method its path does "
                          "not take (405) included; a refused request's error names the field.")
_REFUSALS = {400: {"description": "not JSON, a wrong type, or text that is not Unicode (the error names the field)"},
             405: {"description": "a method other than POST"},
             413: {"description": "a body, document, query, candidate list or question count over the limits"},
             422: {"description": "a question the reader cannot answer: no placeholder or two, a candidate listed "
                                  "twice, an empty candidate or one of several words, no candidate in the document"},
             500: {"description": "the model (or the server itself) failed on this request"},
             503: {"description": "no reader replica could answer"}}
add_docs(app)                      # GET /docs from the package's own copy of Swagger UI: works offline


def _json(content: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(content), status_code=status, media_type="application/json", headers=headers)


def _refusal(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An error in the API's one form, ``{"error", "status"}``."""
    return _json(RequestError(status, message).body(), status, headers)


@app.exception_handler(HTTPException)
async def _routing_error(request: Request, error: HTTPException) -> Response:
    """Starlette's own refusals (an unknown path: 404; a method the path does not take: 405, with
    its ``Allow`` header) in the API's form."""
    where = f"{request.method} {request.url.path}"
    if error.status_code == 404:
        message = f"{where}: no such path; the API is POST /predict, GET /ready, GET / and GET {DOCS_URL}"
    elif error.status_code == 405:
        message = f"{where}: method not allowed; {request.url.path} takes {(error.headers or {}).get('Allow', '')}"
    else:
        message = f"{where}: {error.detail}"
    return _refusal(error.status_code, message, error.headers)


@app.exception_handler(Exception)
async def _server_error(request: Request, error: Exception) -> Response:
    """Anything else the ingress raises: a 500 in the API's form (Starlette raises the error again
    once it is sent, so the replica logs it)."""
    return _refusal(500, f"the server failed on this request ({type(error).__name__})")


class _NoReader(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.body = {"error": f"no reader replica could answer ({type(error).__name__})", "status": 503}


async def _read(request: Request, limit: int) -> bytes:
    """The body, read up to ``limit`` bytes: a larger one (a ``Content-Length`` over it, or a
    chunked body that grows past it) is refused with 413 as soon as that is known."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise RequestError(413, over_limit(limit, int(length)))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, over_limit(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _grpc_on_node_address() -> None:
    """Serve starts a gRPC server in each replica, after its constructor, for calls between
    deployments; on a local cluster (a loopback node address) it listens on loopback too."""
    import ray

    from iaa.platform.cluster.ray_internals import bind_serve_replica_grpc

    bind_serve_replica_grpc(ray.util.get_node_ip_address())


@serve.deployment(name="Reader", health_check_period_s=10, graceful_shutdown_timeout_s=5, max_constructor_retry_count=2)
class Reader:
    """A replica holding the model: answers requests the ingress has checked, within a batch."""

    def __init__(self, config: dict[str, Any], code: ServeCode) -> None:
        from iaa.platform import mlflow_model

        _grpc_on_node_address()
        cfg = from_dict(config)
        self.answerer = code.load(cfg.source, threads=cfg.threads, fetch_model=mlflow_model.fetch)
        self.headers = model_headers(self.answerer.name, self.answerer.version)      # any Unicode name, encoded
        self.answer.set_max_batch_size(cfg.max_batch)
        self.answer.set_batch_wait_timeout_s(cfg.batch_wait_ms / 1000)

    def describe(self, extra: dict[str, Any] | None = None) -> Reply:
        """``GET /ready``'s answer, with the keys of ``extra`` added (``GET /``'s)."""
        info = {"ready": True, "model": self.answerer.model, "load_seconds": round(self.answerer.load_seconds or 0.0, 3)}
        return 200, json.dumps({**info, **(extra or {})}), self.headers

    def traits(self) -> tuple[str, bool]:
        """What checking a request needs of the model: its placeholder and whether it lowercases."""
        return self.answerer.placeholder, self.answerer.lowercase

    async def predict(self, questions: list[Any], single: bool) -> Reply:
        try:
            rows = await self.answer(questions)
        except Exception as error:  # noqa: BLE001 - a failed batch is a 500 for its requests, never a dead replica
            rows = error
        if isinstance(rows, Exception):
            logging.getLogger("ray.serve").error("a request failed in the model: %s: %s", type(rows).__name__,
                                                 log_text(str(rows)))
            failure = {"error": f"the model failed on this request: {type(rows).__name__}: {rows}", "status": 500}
            return 500, json.dumps(failure), self.headers
        return 200, json.dumps(rows[0] if single else rows, ensure_ascii=False), self.headers

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def answer(self, requests: list[list[Any]]) -> list[list[dict[str, Any]] | Exception]:
        return self.answerer.answer(requests)

    def check_health(self) -> None:
        if self.answerer is None:
            raise RuntimeError("no model loaded")


@serve.deployment(name="Ingress", health_check_period_s=10, graceful_shutdown_timeout_s=5)
@serve.ingress(app)
class Ingress:
    """HTTP in front of the readers (FastAPI; ``GET /docs`` and ``/openapi.json`` describe it).
    Every check of a request runs here, before any reader sees it. A request whose reader replica
    dies under it is sent again to another (``RETRIES`` times): a crashed replica costs latency,
    not answers."""

    RETRIES = 2

    def __init__(self, reader: Any, limits: dict[str, Any], code: ServeCode, source: dict[str, Any]) -> None:
        _grpc_on_node_address()
        self.reader = reader
        self.limits = Limits(**limits)
        self.source = (source["kind"], source["ref"])       # what the document's title names
        self.parse, self.api = code.parse, code.api
        self.traits: tuple[str, bool] | None = None        # the model's placeholder and lowercasing, once known
        self.document: dict[str, Any] | None = None         # the OpenAPI document, once the placeholder is known
        self.answered = False                               # a reader has described itself: the model is loaded

    @app.get(OPENAPI_URL, include_in_schema=False)
    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document, for the served model (its name, its placeholder word, examples it
        answers and its answers to them)."""
        try:
            placeholder, lowercase = await asyncio.wait_for(self._traits(), self._wait_s())
        except (asyncio.TimeoutError, _NoReader):
            return _refusal(503, "no reader replica has loaded the model yet")
        if self.document is None:
            try:
                self.document = await self._document(placeholder, lowercase, self._index(request))
            except _NoReader as error:
                return _json(error.body, 503)
        return _json(self.document, 200)

    @app.get("/ready", response_model=Ready, responses={200: {"description": "ready"}, 503: _REFUSALS[503]})
    async def ready(self) -> Response:
        """200 once a reader replica has loaded the model and answered a warm-up question."""
        return await self._describe(None)

    @app.get("/", response_model=Index, responses={200: {"description": "ready, the limits and the API's URLs"},
                                                   503: _REFUSALS[503]})
    async def info(self, request: Request) -> Response:
        """``/ready`` with the limits of a request, and where the API is described."""
        return await self._describe(self._index(request))

    @app.post("/predict", responses=_REFUSALS)
    async def predict(self, request: Request) -> Response:
        """One question, or a list of them: ``iaa-cli predict``'s rows, with the model's name and version."""
        try:
            body = await _read(request, self.limits.max_request_bytes)
            placeholder, lowercase = await self._traits()
            questions, single = await asyncio.to_thread(self.parse, body, placeholder, lowercase, self.limits)
        except RequestError as error:
            return _json(error.body(), error.status)
        except _NoReader as error:
            return _json(error.body, 503)
        return await self._call("predict", questions, single)

    def _index(self, request: Request) -> dict[str, Any]:
        """What ``GET /`` adds to ``/ready``'s answer: the limits, and the URLs of the API's description."""
        base = str(request.base_url).rstrip("/")
        return {"limits": asdict(self.limits), "docs": base + DOCS_URL, "openapi": base + OPENAPI_URL}

    async def _document(self, placeholder: str, lowercase: bool, index: dict[str, Any]) -> dict[str, Any]:
        """The OpenAPI document of the served model: the 200 examples are its own answers."""
        api = self.api(placeholder)
        info = json.loads((await self._remote("describe", index))[1])
        answers = {}
        for name, body in api.examples.items():
            questions, single = await asyncio.to_thread(self.parse, json.dumps(body).encode(), placeholder, lowercase,
                                                        self.limits)
            status, text, _ = await self._remote("predict", questions, single)
            if status == 200:
                answers[name] = json.loads(text)
        ready = {key: info[key] for key in Ready.model_fields}
        return openapi_document(app, api, served_name(*self.source, info["model"]), answers, ready, info)

    async def _traits(self) -> tuple[str, bool]:
        """The model's placeholder and whether it lowercases, asked of a reader once."""
        if self.traits is None:
            self.traits = tuple(await self._remote("traits"))
        return self.traits

    def _wait_s(self) -> float:
        """How long a readiness question waits for a reader: briefly while none has answered yet (a
        starting server says so at once, as a probe expects), longer once one has (a busy reader)."""
        return READY_WAIT_S if self.answered or self.traits is not None else FIRST_WAIT_S

    async def _describe(self, limits: dict[str, int] | None) -> Response:
        try:
            described = await asyncio.wait_for(self._call("describe", limits), self._wait_s())
        except asyncio.TimeoutError:
            return _json({"ready": False, "error": "no reader replica has loaded the model yet", "status": 503}, 503)
        self.answered = self.answered or described.status_code == 200
        return described

    async def _call(self, method: str, *args: Any) -> Response:
        try:
            status, text, headers = await self._remote(method, *args)
        except _NoReader as error:
            return _json(error.body, 503)
        return Response(text, status_code=status, media_type="application/json", headers=headers)

    async def _remote(self, method: str, *args: Any) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        for attempt in range(self.RETRIES + 1):
            try:
                return await getattr(self.reader, method).remote(*args)
            except (ActorDiedError, ActorUnavailableError, RayActorError) as error:
                if attempt == self.RETRIES:
                    raise _NoReader(error) from None
        raise AssertionError("unreachable")


def to_dict(cfg: ServeConfig) -> dict[str, Any]:
    """A config as plain data (what replicas receive and a Serve config file holds)."""
    return asdict(cfg)


def from_dict(data: dict[str, Any]) -> ServeConfig:
    fields = dict(data)
    fields["source"] = ModelSource(**fields["source"])
    fields["limits"] = Limits(**(fields.get("limits") or {}))
    if fields.get("autoscale") is not None:
        fields["autoscale"] = tuple(fields["autoscale"])
    return ServeConfig(**fields)


def deployment_options(cfg: ServeConfig) -> dict[str, Any]:
    """Readers (fixed or autoscaled), each holding ``cpus_per_replica`` Ray CPUs."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": cfg.cpus_per_replica},
                               "max_ongoing_requests": max(8, 4 * cfg.max_batch)}
    if cfg.autoscale is not None:
        low, high = cfg.autoscale
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                                         "target_ongoing_requests": max(2, cfg.max_batch)}
    else:
        options["num_replicas"] = cfg.replicas
    return options


def build(args: dict[str, Any], code: ServeCode) -> Any:
    """The Serve application of ``args`` (a :class:`~iaa.jobs.ports.ServeConfig` as a dict, or
    the flat ``model``/``checkpoint``/``ensemble`` keys of a Serve config file): an ingress (one
    replica, two once there may be two readers, autoscaled up to a quarter of the readers' maximum
    on large deployments) that checks
    each request with ``code.parse``, before the readers, which load the model with ``code.load``."""
    if "source" not in args:
        args = config_args(args)
    cfg = from_dict(args)
    readers = Reader.options(**deployment_options(cfg)).bind(to_dict(cfg), code)
    most = cfg.autoscale[1] if cfg.autoscale else cfg.replicas
    least = ingresses(cfg)          # two once there may be two readers: a lost node leaves one
    ingress = ({"num_replicas": least} if most <= 4 else
               {"autoscaling_config": {"min_replicas": least, "max_replicas": max(least, most // 4)}})
    return Ingress.options(ray_actor_options={"num_cpus": INGRESS_CPUS}, max_ongoing_requests=1000,
                           **ingress).bind(readers, asdict(cfg.limits), code, asdict(cfg.source))


def config_args(args: dict[str, Any]) -> dict[str, Any]:
    """A Serve config file's ``args``: one of ``model``/``checkpoint``/``ensemble`` plus
    ``ServeConfig`` fields (``max_batch``, ``batch_wait_ms``, ``threads``, ``limits``, ...)."""
    rest = dict(args)
    kinds = [k for k in ("model", "checkpoint", "ensemble") if rest.get(k)]
    if len(kinds) != 1:
        raise ValueError("a Serve config's args need exactly one of model, checkpoint, ensemble")
    kind = kinds[0]
    source = {"kind": kind, "ref": rest.pop(kind), "data_dir": rest.pop("data_dir", None),
              "tracking_uri": rest.pop("tracking_uri", None)}
    if "workdir" in rest:
        source["workdir"] = rest.pop("workdir")
    return {**rest, "source": source}


def start(cfg: ServeConfig, code: ServeCode) -> str:
    """Deploy ``cfg`` (readers loading with ``code.load``) on the Ray cluster (``cfg.address`` or a local one); returns the base URL
    once every replica has loaded the model. Raises :class:`IaaError` when a replica cannot start,
    or when the cluster cannot place the replicas (:mod:`iaa.platform.serve_capacity`: a local one
    is checked before anything is deployed). Serve's own progress lines go to Ray's log folder
    (:mod:`iaa.platform.serve_logs`)."""
    import ray

    _connect(cfg)
    local = not (cfg.address or os.environ.get("RAY_ADDRESS"))
    if local:
        check_fits(cfg, ray.cluster_resources(), ray.available_resources())
    with driver_lines_to_log():
        serve.start(http_options={"host": cfg.host, "port": cfg.port}, logging_config={"log_level": "WARNING"},
                    controller_options={"runtime_env": {"env_vars": proxy_env(cfg.limits.max_request_bytes)}})
        # serve.run without its own wait, which has no bound: wait_running waits, bounded
        ray_internals.deploy_without_waiting(build(to_dict(cfg), code), cfg.app_name, ROUTE)
        wait_running(cfg, local, functools.partial(replica_failure, cfg.app_name))
    return listeners.url(cfg.host, cfg.port)


def _connect(cfg: ServeConfig) -> bool:
    """Join ``cfg.address`` (or start a local cluster) unless Ray is up here; True when this call
    started a local cluster, which ends with this process."""
    import ray

    from iaa.platform.cluster import connect as cluster

    if ray.is_initialized():
        return False
    return cluster.connect(cfg.address, dashboard=False).address is None     # Serve needs no dashboard: seconds saved


def replica_failure(app: str) -> str:
    """The last line of the error a replica's constructor raised (Serve keeps its traceback)."""
    status = serve.status().applications.get(app)
    messages = [d.message for d in (status.deployments.values() if status else ()) if d.message]
    lines = [line for m in messages for line in m.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    return re.sub(r"^iaa(\.\w+)*\.\w*Error: ", "", last)        # an expected error: its message alone


def replicas(app: str = "iaa") -> dict[str, int]:
    """How many of the application's reader replicas are in each state (``RUNNING``, ``STARTING``, ...)."""
    status = serve.status().applications.get(app)
    if status is None:
        return {}
    readers = status.deployments.get("Reader")
    return {str(k): int(v) for k, v in readers.replica_states.items()} if readers else {}


def replica_names(app: str = "iaa") -> list[str]:
    """The actor names of the application's live reader replicas."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(f"SERVE_REPLICA::{app}#Reader#"))


def kill_replica(app: str = "iaa") -> str:
    """Kill one reader replica's actor, as a crashed process would die; Serve starts another.
    Returns its name."""
    import ray

    names = replica_names(app)
    if not names:
        raise IaaError(f"application {app} has no replica to kill")
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return names[0]


def replaced(app: str, killed: str, count: int) -> bool:
    """Whether ``killed`` is gone and ``count`` replicas, the new one among them, are running."""
    names = replica_names(app)
    return killed not in names and len(names) == count and replicas(app) == {"RUNNING": count}


def stop(app: str = "iaa", *, local: bool = False) -> None:
    """Delete the application and shut Serve down. ``local``: the cluster is this process's own,
    and is shut down with Serve in it (``serve.shutdown`` makes Ray print a failed, retried
    ``ServeController.graceful_shutdown`` on every stop)."""
    import ray
    from ray.serve.exceptions import RayServeException

    with driver_lines_to_log():
        try:
            serve.delete(app)
        except RayServeException:               # Serve never started (refused first): nothing to delete
            pass
        if local:
            ray.shutdown()
        else:
            serve.shutdown()


def run_forever(cfg: ServeConfig, code: ServeCode) -> None:
    """``iaa-cli serve``: deploy, say where, and serve until Ctrl-C or SIGTERM (:mod:`iaa.platform.serve_life`:
    one server per port, a bounded stop)."""
    serve_life.run_forever(cfg, functools.partial(_connect, cfg), functools.partial(start, cfg, code),
                           lambda local: stop(cfg.app_name, local=local))
