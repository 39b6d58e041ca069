"""What to run after a sweep, printed line by line as it runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from iaa.jobs.ports import (TrialRecord)
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR

from iaa.jobs.tune.settle import TuneRequest

def next_commands(name: str, best: TrialRecord, outputs: dict[str, Any], req: TuneRequest | None,
                  best_config: Path | None = None) -> str:
    """What to run after the sweep: train its best config, its analytics, an ensemble of its best
    configs, a service. Each line runs as printed (the work folder and store are named when not
    the defaults)."""
    q = shlex.quote
    where = "" if req is None or Path(req.workdir) == Path(DEFAULT_WORKDIR) else f" --workdir {q(str(req.workdir))}"
    store = f" --tracking-uri {q(req.tracking_uri)}" if req is not None and req.tracking_uri else ""
    model = (f"--model models:/{req.register}/latest{where}{store}" if req is not None and req.register
             else f"--checkpoint {q(str(best.checkpoint))}")
    return ("next:\n"
            + (f"  iaa-cli train --config {q(str(best_config))}{where}{store}\n" if best_config is not None else "")
            + f"  iaa-cli report --sweep {name}{where}\n"
            f"  iaa-cli ensemble --sweep {name}{where}{store}\n"
            f"  iaa-cli serve {model}")
