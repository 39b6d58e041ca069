"""The reader on Ray Serve: the only module that imports ``ray.serve``.

One deployment, ``Reader``, whose replicas each hold an :class:`iaa.jobs.serve.Answerer`:

- ``POST /predict`` takes ``iaa-cli predict``'s question object, or a list of them, and answers
  with its rows (an object, or a list), each carrying the model's name and version (also in the
  ``x-iaa-model`` and ``x-iaa-model-version`` headers). Requests are parsed and checked on their
  own, then answered in batches: ``serve.batch`` gathers up to ``max_batch`` requests (waiting at
  most ``batch_wait_ms``) into one model call.
- ``GET /ready`` answers 200 from a replica, and a replica takes traffic only once its
  constructor has loaded the model and answered a warm-up question: until then the proxy has
  no replica to route to (503). ``GET /`` says the same plus the limits.
- A refused request is a 400/413/422 JSON ``{"error", "status"}``; an error inside a batch fails
  only the requests of that batch (500) and never the replica.

:func:`build` is also the application builder a Serve config names (``deploy/serve.yaml``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from iaa.errors import IaaError
from iaa.jobs import serve as job

ROUTE = "/"


@serve.deployment(name="Reader", health_check_period_s=10, graceful_shutdown_timeout_s=5, max_constructor_retry_count=2)
class Reader:
    def __init__(self, config: dict[str, Any]) -> None:
        from iaa.platform import mlflow_model

        cfg = from_dict(config)
        self.limits = cfg.limits
        self.answerer = job.Answerer.load(cfg.source, threads=cfg.threads, fetch_model=mlflow_model.fetch)
        self.headers = {"x-iaa-model": self.answerer.name, "x-iaa-model-version": self.answerer.version}
        self.answer.set_max_batch_size(cfg.max_batch)
        self.answer.set_batch_wait_timeout_s(cfg.batch_wait_ms / 1000)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        if request.method == "GET" and path in ("/ready", "/"):
            return self._json({"ready": True, "model": self.answerer.model,
                               **({"limits": asdict(self.limits)} if path == "/" else {})})
        if path != "/predict":
            return self._json({"error": f"no route {request.method} {path}: POST /predict, GET /ready",
                               "status": 404}, 404)
        if request.method != "POST":
            return self._json({"error": "/predict takes POST with a JSON body", "status": 405}, 405)
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > self.limits.max_request_bytes:
            error = job.RequestError(413, f"request: {length} bytes, over the limit of {self.limits.max_request_bytes}")
            return self._json(error.body(), 413)
        try:
            questions, single = self.answerer.parse(await request.body(), self.limits)
        except job.RequestError as error:
            return self._json(error.body(), error.status)
        try:
            rows = await self.answer(questions)
        except Exception as error:  # noqa: BLE001 - a failed batch is a 500 for its requests, never a dead replica
            logging.getLogger("ray.serve").exception("batch failed")
            return self._json({"error": f"the model failed on this batch: {type(error).__name__}: {error}",
                               "status": 500}, 500)
        return self._json(rows[0] if single else rows)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def answer(self, requests: list[list[Any]]) -> list[list[dict[str, Any]]]:
        return self.answerer.answer(requests)

    def check_health(self) -> None:
        if self.answerer is None:
            raise RuntimeError("no model loaded")

    def _json(self, content: Any, status: int = 200) -> Response:
        return Response(json.dumps(content, ensure_ascii=False), status_code=status, media_type="application/json",
                        headers=self.headers)


def to_dict(cfg: job.ServeConfig) -> dict[str, Any]:
    """A config as plain data (what replicas receive and a Serve config file holds)."""
    return asdict(cfg)


def from_dict(data: dict[str, Any]) -> job.ServeConfig:
    fields = dict(data)
    fields["source"] = job.ModelSource(**fields["source"])
    fields["limits"] = job.Limits(**(fields.get("limits") or {}))
    if fields.get("autoscale") is not None:
        fields["autoscale"] = tuple(fields["autoscale"])
    return job.ServeConfig(**fields)


def deployment_options(cfg: job.ServeConfig) -> dict[str, Any]:
    """Replicas (fixed or autoscaled), each holding ``cpus_per_replica`` Ray CPUs."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": cfg.cpus_per_replica},
                               "max_ongoing_requests": max(8, 4 * cfg.max_batch)}
    if cfg.autoscale is not None:
        low, high = cfg.autoscale
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                                         "target_ongoing_requests": max(2, cfg.max_batch)}
    else:
        options["num_replicas"] = cfg.replicas
    return options


def build(args: dict[str, Any]) -> Any:
    """The Serve application of ``args`` (a :class:`~iaa.jobs.serve.ServeConfig` as a dict, or
    the flat ``model``/``checkpoint``/``ensemble`` keys of a Serve config file)."""
    if "source" not in args:
        args = config_args(args)
    cfg = from_dict(args)
    return Reader.options(**deployment_options(cfg)).bind(to_dict(cfg))


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


def start(cfg: job.ServeConfig) -> str:
    """Deploy ``cfg`` on the Ray cluster (``cfg.address`` or a local one); returns the base URL
    once every replica has loaded the model (``serve.run`` waits for that, and raises when a
    replica cannot start)."""
    import ray

    from iaa.platform import cluster

    if not ray.is_initialized():
        cluster.connect(cfg.address)
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, logging_config={"log_level": "WARNING"})
    try:
        serve.run(build(to_dict(cfg)), name=cfg.app_name, route_prefix=ROUTE, blocking=False)
    except RuntimeError as err:          # Serve's DeploymentFailed: a replica's constructor raised
        raise IaaError(f"the model could not be served: {str(err)[-1500:]}") from err
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host}:{cfg.port}"


def replicas(app: str = "iaa") -> dict[str, int]:
    """How many of the application's replicas are in each state (``RUNNING``, ``STARTING``, ...)."""
    status = serve.status().applications.get(app)
    if status is None:
        return {}
    return {str(k): int(v) for d in status.deployments.values() for k, v in d.replica_states.items()}


def kill_replica(app: str = "iaa") -> str:
    """Kill one replica's actor, as a crashed process would die; Serve starts another. Returns its name."""
    import ray

    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith(f"SERVE_REPLICA::{app}#"))
    if not names:
        raise IaaError(f"application {app} has no replica to kill")
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return names[0]


def stop(app: str = "iaa") -> None:
    serve.delete(app)
    serve.shutdown()


def run_forever(cfg: job.ServeConfig) -> None:
    """``iaa-cli serve``: deploy, say where, and serve until Ctrl-C."""
    url = start(cfg)
    print(f"serving on {url}: POST {url}/predict, GET {url}/ready (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop(cfg.app_name)
