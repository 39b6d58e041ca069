"""Check the deploy manifests without a cluster: YAML syntax, and the conventions they share.

    python deploy/validate.py        # prints one line per file; exits 1 on the first problem

It cannot start a cluster: it parses ``cluster.yaml`` (Ray cluster launcher), ``rayjob.yaml``
(KubeRay), ``mlflow.yaml`` (Kubernetes, several documents) and ``serve.yaml`` (Ray Serve), checks
that the Serve application is ``iaa-cli serve``'s with a registered model, and that they use the
image built from the Dockerfile, give the head the ``trial_driver`` resource and no GPUs, keep
GPU workers at 0 to start, and point the sweep at the MLflow Service that ``mlflow.yaml`` defines.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
IMAGE = f"YOUR-REGISTRY/iaa:{version('iaa')}"         # tagged with the package's version (pyproject.toml)
DRIVER_RESOURCE = "trial_driver"


def _need(ok: bool, file: str, what: str) -> None:
    if not ok:
        raise SystemExit(f"{file}: {what}")


def check_cluster(doc: dict[str, Any]) -> None:
    f = "cluster.yaml"
    _need(doc["docker"]["image"] == IMAGE, f, f"docker.image must be {IMAGE}")
    head = doc["available_node_types"][doc["head_node_type"]]
    _need(head["resources"].get(DRIVER_RESOURCE, 0) > 0 and "GPU" not in head["resources"], f,
          f"the head needs {DRIVER_RESOURCE} and no GPU")
    gpu = [t for t in doc["available_node_types"].values() if t.get("resources", {}).get("GPU")]
    _need(bool(gpu) and all(t.get("min_workers", 0) == 0 for t in gpu), f, "GPU workers must start at 0")
    start = " ".join(doc["head_start_ray_commands"])
    _need(f'"{DRIVER_RESOURCE}"' in start and "mlflow server" in start and "--dashboard-host=127.0.0.1" in start,
          f, "the head must start with the trial_driver resource, a loopback dashboard and an MLflow server")
    _need(not any("pip install -e" in c for c in doc.get("setup_commands") or []), f, "dependencies come from the image")


def check_rayjob(doc: dict[str, Any], mlflow_url: str) -> None:
    f = "rayjob.yaml"
    _need(doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob", f, "a ray.io/v1 RayJob")
    _need("runtimeEnvYAML" not in doc["spec"], f, "no runtime env: dependencies come from the image")
    spec = doc["spec"]["rayClusterSpec"]
    head = spec["headGroupSpec"]
    resources = json.loads(json.loads(head["rayStartParams"]["resources"]))
    _need(resources.get(DRIVER_RESOURCE, 0) > 0 and head["rayStartParams"]["num-gpus"] == "0", f,
          f"the head needs {DRIVER_RESOURCE} and no GPUs")
    images = {c["image"] for g in [head, *spec["workerGroupSpecs"]] for c in g["template"]["spec"]["containers"]}
    _need(images == {IMAGE}, f, f"every container runs {IMAGE}")
    _need(all(g["minReplicas"] == 0 for g in spec["workerGroupSpecs"]), f, "GPU workers must start at 0")
    _need(f"--tracking-uri {mlflow_url}" in doc["spec"]["entrypoint"], f, f"the sweep logs to {mlflow_url}")


def check_mlflow(docs: list[dict[str, Any]]) -> str:
    f = "mlflow.yaml"
    kinds = {d["kind"]: d for d in docs}
    _need({"Namespace", "PersistentVolumeClaim", "Deployment", "Service"} <= set(kinds), f, "missing a document")
    deploy, service = kinds["Deployment"], kinds["Service"]
    _need(deploy["spec"]["replicas"] == 1, f, "one server owns the SQLite store")
    command = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
    _need(command[:2] == ["mlflow", "server"] and "sqlite:////mlflow/mlflow.db" in command, f, "an MLflow server")
    port = service["spec"]["ports"][0]["port"]
    return f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:{port}"


SERVE_ARGS = {"model", "checkpoint", "ensemble", "data_dir", "workdir", "tracking_uri", "replicas", "autoscale",
              "max_batch", "batch_wait_ms", "cpus_per_replica", "threads", "limits", "app_name"}


def check_serve(doc: dict[str, Any], mlflow_url: str) -> None:
    f = "serve.yaml"
    (app,) = doc["applications"]
    _need(app["import_path"] == "iaa.cli:serve_app", f, "the application is iaa.cli:serve_app")
    args = app["args"]
    _need(set(args) <= SERVE_ARGS, f, f"unknown args {sorted(set(args) - SERVE_ARGS)}")
    _need(str(args.get("model", "")).startswith("models:/"), f, "replicas on any node serve a registered model")
    _need(args.get("tracking_uri") == mlflow_url, f, f"the model comes from {mlflow_url}")
    _need(float(args.get("cpus_per_replica", 0)) >= int(args.get("threads", 1)), f, "a replica's threads fit its CPUs")


def main() -> None:
    load = lambda name: list(yaml.safe_load_all((HERE / name).read_text(encoding="utf-8")))  # noqa: E731
    url = check_mlflow(load("mlflow.yaml"))
    check_rayjob(load("rayjob.yaml")[0], url)
    check_cluster(load("cluster.yaml")[0])
    check_serve(load("serve.yaml")[0], url)
    _need("torch==2.13.0" in (HERE / "Dockerfile").read_text(encoding="utf-8"), "Dockerfile", "torch 2.13.0 baked in")
    print(f"mlflow.yaml: ok ({url})\nrayjob.yaml: ok\ncluster.yaml: ok\nserve.yaml: ok\nDockerfile: ok")


if __name__ == "__main__":
    sys.exit(main())
