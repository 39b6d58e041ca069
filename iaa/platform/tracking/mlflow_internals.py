"""The one place that reads MLflow's private state: the tracking and registry URIs as this process
set them, which MLflow's public getters hide behind their defaults, and the process-wide cache of
artifact repositories, which MLflow keys by run or model id whatever the store.

``tests/test_private_apis.py`` checks every name used here against the installed MLflow, so an
upgrade that moves one fails there, by name, and not in a user's ``log_model``.
"""

from __future__ import annotations

# (module, attribute): what this file reads; the test imports each.
NAMES = (("mlflow.tracking._tracking_service.utils", "_tracking_uri"),
         ("mlflow.tracking._model_registry.utils", "_registry_uri"),
         ("mlflow.tracking._tracking_service.utils", "_artifact_repos_cache"))


def set_uris() -> tuple[str | None, str | None]:
    """The tracking and registry URIs set in this process (``mlflow.set_*_uri``); None where unset."""
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    return tracking._tracking_uri, registry._registry_uri


def restore_registry_uri(uri: str | None) -> None:
    """Put back a registry URI read by :func:`set_uris` (``mlflow.set_registry_uri`` cannot unset it)."""
    from mlflow.tracking._model_registry import utils as registry

    registry._registry_uri = uri


def forget_artifact_repositories() -> None:
    """Empty MLflow's cache of artifact repositories. It is keyed by run (or logged model) id alone,
    so after a process used one store, a copy of it (the same ids, other artifact locations) would
    be given the first store's folders."""
    from mlflow.tracking._tracking_service import utils as tracking

    tracking._artifact_repos_cache.clear()
