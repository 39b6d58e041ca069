"""What to run after a sweep, printed line by line as it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iaa.jobs.evaluation.closing import Command, next_block, where
from iaa.jobs.ports import TrialRecord
from iaa.jobs.tune.request import TuneRequest


def next_commands(name: str, best: TrialRecord, outputs: dict[str, Any], req: TuneRequest | None,
                  best_config: Path | None = None) -> str:
    """What to run after the sweep: train its best config, its analytics, an ensemble of its best
    configs, a service. Each line runs as printed (the work folder and store are named when not
    the defaults)."""
    at = where(req.workdir, req.tracking_uri) if req is not None else {}
    folder = {k: v for k, v in at.items() if k == "workdir"}
    model = (dict(model_uri=f"models:/{req.register}/latest", **at) if req is not None and req.register
             else dict(checkpoint=str(best.checkpoint)))
    return next_block([*([Command.of("train", config_file=str(best_config), **at)] if best_config is not None else []),
                       Command.of("report", sweep=name, **folder),
                       Command.of("ensemble", sweep=name, **at),
                       Command.of("serve", **model)])
