"""A searcher's study bound as a running sweep binds it, for tests that drive the searcher alone."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping


@contextmanager
def bound_study(url: str, name: str, run_ids: Mapping[str, str] | None = None) -> Iterator[None]:
    """While the block runs, the Tune run ``name``'s searcher uses the Optuna study ``name`` at ``url``."""
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial import TrialSpec

    spec = TrialSpec(name=name, fit=None, storage_path=str(Path(url.removeprefix("sqlite:///")).parent),
                     workers=1, threads=1)
    side = driver_side.DriverSide(tracker=None, experiment=name, parent_run_id=None, dataset="", spec=spec,
                                  study_storage=url, study_name=name, run_ids=dict(run_ids or {}))
    with driver_side.bound(name, side):
        yield


def stopped_and_resumed(url: str, name: str, space, saved: Path):
    """The searcher of sweep ``name`` after a stop (its study's unfinished trials FAIL, as a SIGINT
    marks them) and a resume (a new searcher restored from what Tune saved at ``saved``)."""
    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.studies.endings import fail_unfinished

    fail_unfinished(url, name, {"interrupted": "SIGINT"})
    resumed = search.searcher(space, seed=0, sweep=name)
    resumed.restore(str(saved))
    return resumed
