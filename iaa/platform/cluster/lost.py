"""Whether a failed trial or Train run lost a worker (its process or its node died) rather than
raised an error of its own: a lost worker is what a restore from the last checkpoint gets past,
so a run out of restores says so in one line and how to continue, instead of Ray's traceback."""

from __future__ import annotations

from typing import Any, Iterator


def worker_lost(error: object) -> bool:
    """``error``, or an error it carries, is Ray's word that a worker died: its actor, its worker
    process or its node (anything but an exception, such as an error's text, is not).

    Ray wraps the death in its own errors: Tune keeps the actor's error, Ray Train a per-rank
    ``worker_failures`` map whose health-check failure holds the actor's error, and a task's error
    its cause. All of them are searched (causes, contexts and attributes that hold errors).
    """
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError

    return any(isinstance(err, (RayActorError, WorkerCrashedError, NodeDiedError)) for err in _carried(error))


def _carried(error: object) -> Iterator[BaseException]:
    """``error`` and every error it carries, each once."""
    seen: set[int] = set()
    stack: list[Any] = [error]
    while stack:
        err = stack.pop()
        if not isinstance(err, BaseException) or id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        stack += [err.__cause__, err.__context__]
        for value in getattr(err, "__dict__", {}).values():
            stack += value.values() if isinstance(value, dict) else [value]
