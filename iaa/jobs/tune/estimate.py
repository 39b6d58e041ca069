"""The sweep's cost, probed on this machine and printed before the first trial starts (the
console then shows progress against it).
"""

from __future__ import annotations

import logging
from pathlib import Path

from iaa.jobs.config.job_config import apply, config_label
from iaa.jobs.ports import Placement, SearchPlan
from iaa.jobs.sweeps.cost import SWEEP_START_S, TRIAL_START_S, SweepCost, probe

_log = logging.getLogger(__name__)


def estimate_cost(launch: Placement, search: SearchPlan, prepared: Path, per_check: int = 0) -> SweepCost:
    """The size and longest wall time of ``search`` on the data ``prepared``, printed before the
    first trial starts: the throughput of the costliest trial the space allows, and of the base
    config where that differs; a warning where the time budget ends the trials before their first
    check (``per_check`` training examples; 0: not known)."""
    from iaa.data.prepared.manifest import counted

    gpus = launch.gpus_per_worker > 0
    largest, raised = search.space.costliest(search.base)
    rate = 0.0 if gpus else probe(largest, prepared, launch.threads)
    valid_rate = 0.0 if gpus else probe(largest, prepared, launch.threads, split="valid")
    base_rate = 0.0
    if not gpus and raised:
        base_rate = probe(apply(search.base, search.space.fixed), prepared, launch.threads)
    valid = counted(prepared, "valid")
    cost = SweepCost(trials=search.num_samples, epochs=largest.train.max_epochs, examples=launch.train_rows,
                     examples_per_s=rate, concurrency=launch.fits_now or launch.max_concurrent, gpus=gpus,
                     gpus_per_trial=launch.gpus_per_worker, checks=search.checks, valid_examples=valid,
                     valid_examples_per_s=valid_rate, start_s=SWEEP_START_S, trial_start_s=TRIAL_START_S,
                     budget_s=search.time_budget_s, costliest=config_label(raised) if raised else "",
                     base_examples_per_s=base_rate, first_check_examples=per_check)
    _log.info(cost.describe())
    for note in cost.budget_notes():
        _log.warning(note)
    return cost
