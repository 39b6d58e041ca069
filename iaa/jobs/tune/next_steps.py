"""What to run after a sweep: the commands its result carries and its summary prints.
"""

from __future__ import annotations

from pathlib import Path

from iaa.jobs.evaluation.closing import Command, next_block
from iaa.jobs.ports import TrialRecord
from iaa.jobs.tune.settle import SweepPlan


def next_steps(plan: SweepPlan, best: TrialRecord, best_config: Path | None = None,
               top_configs: int = 1) -> tuple[Command, ...]:
    """What to run after the sweep: train its best config, its analytics, an ensemble of its
    ``top_configs`` best configs, a service. Each line runs as printed from any folder (it names
    the work folder, and the store where one was given)."""
    folder = {k: v for k, v in (plan.options or {}).items() if k == "workdir"}
    serve = (plan.command("serve", model_uri=f"models:/{plan.register}/latest") if plan.register
             else Command.of("serve", checkpoint=str(best.checkpoint), **folder))
    return (*([plan.command("train", config_file=str(best_config))] if best_config is not None else []),
            Command.of("report", sweep=plan.name, **folder),
            plan.command("ensemble", sweep=plan.name, top_configs=top_configs if top_configs > 1 else None),
            serve)


def next_commands(plan: SweepPlan, best: TrialRecord, best_config: Path | None = None) -> str:
    """:func:`next_steps` as the summary's block: ``next:`` and a command a line."""
    return next_block(next_steps(plan, best, best_config))
