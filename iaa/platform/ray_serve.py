"""The reader on Ray Serve: the only module that imports ``ray.serve``.

Two deployments. ``Reader`` replicas each hold the answerer that the job's ``load``
(:meth:`iaa.jobs.inference.serve.Answerer.load`) returns; ``Ingress`` takes HTTP and hands each request's
bytes to a reader:

- ``POST /predict`` takes ``iaa-cli predict``'s question object, or a list of them, and answers
  with its rows (an object, or a list), each carrying the model's name and version (also in the
  ``x-iaa-model`` and ``x-iaa-model-version`` headers). A reader parses and checks each request
  on its own, then answers it in a batch: ``serve.batch`` gathers up to ``max_batch`` requests
  (waiting at most ``batch_wait_ms``) into one model call.
- ``GET /ready`` answers 200 once a reader has loaded the model and answered a warm-up question
  (a reader takes requests only after its constructor), else 503. ``GET /`` adds the limits.
- A refused request is a 400/413/422 JSON ``{"error", "status"}``; an error inside a batch fails
  only the requests of that batch (500) and never the replica. A request whose reader dies under
  it is sent to another reader.

:func:`build` makes the application; a Serve config (``deploy/serve.yaml``) names
:func:`iaa.cli.serve_app`, which hands it the job's loader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import asdict
from typing import Any, Callable

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from iaa.errors import IaaError
from iaa.jobs.ports import Limits, ModelSource, RequestError, ServeConfig

ROUTE = "/"
READY_WAIT_S = 5.0                 # GET /ready: how long to wait for a reader before 503


Reply = tuple[int, str, dict[str, str]]          # status, JSON text, headers
# (source, threads=, fetch_model=) -> a loaded, warmed-up iaa.jobs.inference.serve.Answerer; pickled by reference
AnswererLoader = Callable[..., Any]


@serve.deployment(name="Reader", health_check_period_s=10, graceful_shutdown_timeout_s=5, max_constructor_retry_count=2)
class Reader:
    """A replica holding the model: parses a request body and answers it within a batch."""

    def __init__(self, config: dict[str, Any], load: AnswererLoader) -> None:
        from iaa.platform import mlflow_model

        cfg = from_dict(config)
        self.limits = cfg.limits
        self.answerer = load(cfg.source, threads=cfg.threads, fetch_model=mlflow_model.fetch)
        self.headers = {"x-iaa-model": self.answerer.name, "x-iaa-model-version": self.answerer.version}
        self.answer.set_max_batch_size(cfg.max_batch)
        self.answer.set_batch_wait_timeout_s(cfg.batch_wait_ms / 1000)

    def describe(self, with_limits: bool = False) -> Reply:
        info = {"ready": True, "model": self.answerer.model, "load_seconds": round(self.answerer.load_seconds or 0.0, 3)}
        return 200, json.dumps({**info, **({"limits": asdict(self.limits)} if with_limits else {})}), self.headers

    async def predict(self, body: bytes) -> Reply:
        try:
            questions, single = self.answerer.parse(body, self.limits)
        except RequestError as error:
            return error.status, json.dumps(error.body(), ensure_ascii=False), self.headers
        try:
            rows = await self.answer(questions)
        except Exception as error:  # noqa: BLE001 - a failed batch is a 500 for its requests, never a dead replica
            logging.getLogger("ray.serve").exception("batch failed")
            failure = {"error": f"the model failed on this batch: {type(error).__name__}: {error}", "status": 500}
            return 500, json.dumps(failure), self.headers
        return 200, json.dumps(rows[0] if single else rows, ensure_ascii=False), self.headers

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def answer(self, requests: list[list[Any]]) -> list[list[dict[str, Any]]]:
        return self.answerer.answer(requests)

    def check_health(self) -> None:
        if self.answerer is None:
            raise RuntimeError("no model loaded")


@serve.deployment(name="Ingress", health_check_period_s=10, graceful_shutdown_timeout_s=5)
class Ingress:
    """HTTP in front of the readers. A request whose reader replica dies under it is sent again
    to another (``RETRIES`` times): a crashed replica costs latency, not answers."""

    RETRIES = 2

    def __init__(self, reader: Any, limits: dict[str, Any]) -> None:
        self.reader = reader
        self.limits = Limits(**limits)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        if request.method == "GET" and path in ("/ready", "/"):
            try:
                return await asyncio.wait_for(self._call("describe", path == "/"), READY_WAIT_S)
            except asyncio.TimeoutError:
                return _json({"ready": False, "error": "no reader replica has loaded the model yet", "status": 503}, 503)
        if path != "/predict":
            return _json({"error": f"no route {request.method} {path}: POST /predict, GET /ready", "status": 404}, 404)
        if request.method != "POST":
            return _json({"error": "/predict takes POST with a JSON body", "status": 405}, 405)
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > self.limits.max_request_bytes:
            error = RequestError(413, f"request: {length} bytes, over the limit of {self.limits.max_request_bytes}")
            return _json(error.body(), 413)
        return await self._call("predict", await request.body())

    async def _call(self, method: str, *args: Any) -> Response:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        for attempt in range(self.RETRIES + 1):
            try:
                status, text, headers = await getattr(self.reader, method).remote(*args)
                return Response(text, status_code=status, media_type="application/json", headers=headers)
            except (ActorDiedError, ActorUnavailableError, RayActorError) as error:
                if attempt == self.RETRIES:
                    return _json({"error": f"no reader replica could answer ({type(error).__name__})", "status": 503},
                                 503)
        raise AssertionError("unreachable")


def _json(content: Any, status: int) -> Response:
    return Response(json.dumps(content), status_code=status, media_type="application/json")


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


INGRESS_CPUS = 0.1                   # it only reads HTTP and forwards bytes


def build(args: dict[str, Any], load: AnswererLoader) -> Any:
    """The Serve application of ``args`` (a :class:`~iaa.jobs.ports.ServeConfig` as a dict, or
    the flat ``model``/``checkpoint``/``ensemble`` keys of a Serve config file): an ingress (one
    replica, autoscaled up to a quarter of the readers' maximum on large deployments) before the
    readers, which load the model with ``load``."""
    if "source" not in args:
        args = config_args(args)
    cfg = from_dict(args)
    readers = Reader.options(**deployment_options(cfg)).bind(to_dict(cfg), load)
    most = cfg.autoscale[1] if cfg.autoscale else cfg.replicas
    ingress = {"num_replicas": 1} if most <= 4 else {"autoscaling_config": {"min_replicas": 1, "max_replicas": most // 4}}
    return Ingress.options(ray_actor_options={"num_cpus": INGRESS_CPUS}, max_ongoing_requests=1000,
                           **ingress).bind(readers, asdict(cfg.limits))


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


def start(cfg: ServeConfig, load: AnswererLoader) -> str:
    """Deploy ``cfg`` (readers loading with ``load``) on the Ray cluster (``cfg.address`` or a local one); returns the base URL
    once every replica has loaded the model (``serve.run`` waits for that, and raises when a
    replica cannot start)."""
    import ray

    from iaa.platform.cluster import connect as cluster

    if not ray.is_initialized():
        cluster.connect(cfg.address, dashboard=False)     # Serve needs no dashboard: seconds saved
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, logging_config={"log_level": "WARNING"})
    try:
        serve.run(build(to_dict(cfg), load), name=cfg.app_name, route_prefix=ROUTE, blocking=False)
    except RuntimeError as err:          # DEPLOY_FAILED: a replica's constructor raised
        raise IaaError(f"the model could not be served: {_failure(cfg.app_name) or err}") from err
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host}:{cfg.port}"


def _failure(app: str) -> str:
    """The last line of the error a replica's constructor raised (Serve keeps its traceback)."""
    status = serve.status().applications.get(app)
    messages = [d.message for d in (status.deployments.values() if status else ()) if d.message]
    lines = [line for m in messages for line in m.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


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


def stop(app: str = "iaa") -> None:
    serve.delete(app)
    serve.shutdown()


def run_forever(cfg: ServeConfig, load: AnswererLoader) -> None:
    """``iaa-cli serve``: deploy, say where, and serve until Ctrl-C."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)        # a service manager's stop: shut Serve down too
    signal.signal(signal.SIGINT, interrupt)         # also when started with SIGINT ignored (`cmd &`)
    url = start(cfg, load)
    print(f"serving on {url}: POST {url}/predict, GET {url}/ready (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop(cfg.app_name)
