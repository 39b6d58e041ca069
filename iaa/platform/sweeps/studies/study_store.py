"""The Optuna store of a sweep's study: opened with SQLite's patience, a full disk as one line."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from iaa.files import DiskFullError, disk_full, free_bytes, size_text


def quiet_optuna() -> None:
    """Optuna's own INFO lines (``A new study created ...``, ``Using an existing study ...``, on
    stderr in its own format) held back: the sweep says what it does in its own lines. Its
    warnings still come, and a stricter level set before (``ERROR``) stays. Called wherever the
    adapter opens a study, since a resumed sweep's searcher comes back from Tune's pickle without
    being built again."""
    import optuna

    if optuna.logging.get_verbosity() < optuna.logging.WARNING:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_storage(url: str) -> Any:
    """An Optuna RDB storage at ``url``; SQLite waits for a reader (optuna-dashboard) instead of failing.
    A full disk is one :class:`iaa.files.DiskFullError` naming the store. Optuna's INFO lines are
    held back (:func:`quiet_optuna`)."""
    import optuna

    quiet_optuna()
    kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}
    with study_writes(url, "be opened"):
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def existing_study(url: str, name: str) -> tuple[Any, int] | None:
    """The storage at ``url`` and the id of its study ``name``; None where it holds no such study.
    A SQLite file that does not exist holds none, and none is made."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    storage = study_storage(url)
    try:
        return storage, storage.get_study_id_from_name(name)
    except KeyError:
        return None


def study_exists(url: str, name: str) -> bool:
    """Whether the storage at ``url`` holds study ``name`` (see :func:`existing_study`)."""
    return existing_study(url, name) is not None


@contextlib.contextmanager
def study_writes(url: str, failed: str) -> Iterator[None]:
    """Turn a full disk met by the Optuna store ``url`` (SQLAlchemy's "database or disk is full",
    an OSError) into one DiskFullError saying what the store could not do (``failed``)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as err:                  # SQLAlchemy's and Optuna's errors have no common base
        if not disk_full(err):
            raise
        raise study_full(url, failed) from None


def study_full(url: str, failed: str) -> DiskFullError:
    """The one error (a DiskFullError) of the Optuna store ``url`` on a full disk: the store, the free
    space of its own file system, and what it could not do (``failed``)."""
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    free = free_bytes(path) if path else None
    told = f" ({size_text(free)} free)" if free is not None else ""
    return DiskFullError(f"no space left on device for the Optuna store {path or url}{told}: it could not "
                         f"{failed}; free some space on its disk or pass another `optuna_storage`")
