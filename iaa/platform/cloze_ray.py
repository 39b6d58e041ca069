"""Tagging for make-cloze on Ray Data: ``map_batches`` over work units, one tagger per actor.

Loading a spaCy pipeline takes about a second and hundreds of MB, so each actor builds one tagger
in its constructor and keeps it for every batch. The driver gets back each unit's tagging as an
encoded string and puts the units back in order itself, so the result does not depend on how Ray
schedules them.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from iaa import logs
from iaa.data.cloze.tagging import Tagger, Unit, tag_units

BATCH_UNITS = 4  # units per map_batches call (about 1,000 sentences)


class _TagActor:
    def __init__(self, factory: Callable[[], Tagger]) -> None:
        self.tagger = factory()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        units = [Unit(int(u), int(d), str(k), str(t))
                 for u, d, k, t in zip(batch["unit"], batch["doc"], batch["kind"], batch["text"])]
        return {"unit": batch["unit"], "tagged": np.array(tag_units(self.tagger, units), dtype=object)}


def tag(units: Sequence[Unit], factory: Callable[[], Tagger], *, workers: int | None = None,
        address: str | None = None, progress: bool = True) -> list[str]:
    """The encoded tagging of each unit, in ``units`` order.

    Args:
        factory: picklable zero-argument function that builds a tagger (on each actor).
        workers: tagger actors, 1 CPU each [default: one per CPU of the cluster].
        address: Ray cluster to use [default: ``RAY_ADDRESS``, else a new local Ray].
    """
    import ray

    from iaa.platform.cluster.connect import connect

    # "local" starts a Ray of our own: without an address ray.init joins whichever local Ray
    # started last, and another user's cluster on the same machine is not ours to load.
    connect(address or os.environ.get("RAY_ADDRESS") or "local")
    actors = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    rows = [{"unit": u.unit, "doc": u.doc, "kind": u.kind, "text": u.text} for u in units]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows), actors * 8)))
    tagged = ds.map_batches(_TagActor, fn_constructor_kwargs={"factory": factory}, batch_size=BATCH_UNITS,
                            batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1)
    out: list[str | None] = [None] * len(units)
    position = {u.unit: i for i, u in enumerate(units)}
    with logs.progress(f"tagging on Ray ({actors} actors)", "unit", total=len(units), shown=progress) as bar:
        for row in tagged.iter_rows():
            out[position[int(row["unit"])]] = str(row["tagged"])
            bar.update(1)
    missing = [u.unit for u, text in zip(units, out) if text is None]
    if missing:
        raise RuntimeError(f"Ray returned no tagging for {len(missing)} unit(s), e.g. {missing[:3]}")
    return [t for t in out if t is not None]
