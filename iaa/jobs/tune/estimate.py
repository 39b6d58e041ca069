"""The sweep's cost, probed on this machine and printed before the first trial starts (the
console then shows progress against it).
"""

from __future__ import annotations

import logging

from iaa.jobs.sweeps.cost import SWEEP_START_S, TRIAL_START_S, SweepCost, probe
from iaa.jobs.ports import (Placement)

from iaa.jobs.tune.settle import Settled

_log = logging.getLogger(__name__)


def estimate_cost(launch: Placement, s: Settled, checks: int) -> SweepCost:
    """The sweep's size and expected wall time (``checks``: a trial's validation checks, at most),
    printed before the first trial starts."""
    from iaa.data.manifest import read as read_manifest

    gpus = launch.gpus_per_worker > 0
    rate = 0.0 if gpus else probe(s.base, s.prepared, launch.threads)
    valid_rate = 0.0 if gpus else probe(s.base, s.prepared, launch.threads, split="valid")
    valid = int(((read_manifest(s.prepared) or {}).get("counts") or {}).get("valid", 0))
    cost = SweepCost(trials=s.num_samples, epochs=s.base.train.max_epochs, examples=launch.train_rows,
                     examples_per_s=rate, concurrency=launch.max_concurrent, gpus=gpus,
                     gpus_per_trial=launch.gpus_per_worker, checks=checks, valid_examples=valid,
                     valid_examples_per_s=valid_rate, start_s=SWEEP_START_S, trial_start_s=TRIAL_START_S)
    _log.info(cost.describe())
    return cost
