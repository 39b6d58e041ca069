"""Which checkpoints make up a sweep ensemble: the K best configurations x N seeds, reused or to train.

A sweep's K best configurations (by the trials' ``best_valid_acc``; configurations that differ
only in ``train.seed`` count as one) each get N seeds: the trial's own ``train.seed + i`` for
``i = 0 .. N-1``, so seed ``i = 0`` is the trial itself. A member whose config equals, field for
field (seed included), a trial with a checkpoint on disk that trained its configuration's whole
budget (:func:`short_of_budget`: not stopped by ASHA or the sweep's time budget), or a member
trained by an earlier ensemble in the same workdir, reuses that checkpoint; a trial stopped short
is trained again in full, like the configuration's other seeds. Every ensemble records the members it
trained in its own ``trained.json`` (the ledger), which later ensembles read.

Pure file and config logic: training the missing members is the platform's business.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.config.job_config import JobConfig, from_dict, to_dict
from iaa.jobs.ports import TIME_BUDGET, TrialRecord
from iaa.jobs.workdir import recorded
from iaa.jobs.workdir.paths import Workdir

_log = logging.getLogger(__name__)

LEDGER = "trained.json"


@dataclass(frozen=True)
class Member:
    """One checkpoint of an ensemble and where it came from."""

    checkpoint: Path
    config: JobConfig
    mlflow_run_id: str | None
    label: str                    # short name for the table
    source: str                   # given | trial <id> | trained | trained earlier
    sha256: str | None = None     # of the file's bytes when the ensemble first read it
    vocab_hash: str = ""          # the vocabulary it was trained on, where read before the run ("": not read)


def first_read(member: Member) -> Member:
    """``member`` with its absolute path and the sha256 of its file, taken now (keeps one taken earlier)."""
    from iaa.data.prepared.shards import file_sha256

    path = Path(member.checkpoint).resolve()
    return replace(member, checkpoint=path, sha256=member.sha256 or file_sha256(path))


def check_unchanged(members: Sequence[Member], name: str) -> None:
    """Refuse a member whose file is no longer the one first read (retrained or replaced meanwhile):
    its accuracy and predictions belong to other weights."""
    from iaa.data.prepared.shards import file_sha256

    for member in members:
        now = file_sha256(member.checkpoint) if Path(member.checkpoint).is_file() else "missing"
        if now != member.sha256:
            raise IaaError(f"{member.checkpoint}: changed while ensemble {name!r} was built (sha256 "
                           f"{(member.sha256 or '')[:12]} when first read, now {now[:12]}), so its evaluation "
                           "describes other weights; run the ensemble again once the member is final")


def config_key(cfg: JobConfig | Mapping[str, Any], *, ignore_seed: bool = False) -> str:
    """A canonical text of ``cfg``; dicts go through ``from_dict`` so that 4 and 4.0 compare equal."""
    data = to_dict(cfg if isinstance(cfg, JobConfig) else from_dict(cfg))
    if ignore_seed:
        data["train"].pop("seed", None)
    return json.dumps(data, sort_keys=True)


def existing(path: str | None, bases: Sequence[Path]) -> Path | None:
    """``path`` if it is a file, else the first ``base / path`` that is."""
    if not path:
        return None
    candidates = [Path(path)] + [base / path for base in bases if not Path(path).is_absolute()]
    return next((c for c in candidates if c.is_file()), None)


def best_configs(name: str, trials: Sequence[TrialRecord], k: int) -> list[JobConfig]:
    """The ``k`` best distinct configurations (seed ignored) by the trials' best valid accuracy."""
    ranked = sorted((t for t in trials if t.scored), key=lambda t: -float(t.best_valid_acc or 0.0))
    chosen: dict[str, JobConfig] = {}
    for trial in ranked:
        chosen.setdefault(config_key(trial.config, ignore_seed=True), trial.config)
        if len(chosen) == k:
            break
    if not chosen:
        raise IaaError(f"sweep {name!r} has no finished trial with a validation accuracy")
    if len(chosen) < k:
        _log.info(f"ensemble: sweep {name!r} has only {len(chosen)} distinct configurations; "
                  f"using {len(chosen)} instead of {k}")
    return list(chosen.values())


def seeded(configs: Sequence[JobConfig], seeds: int) -> list[tuple[JobConfig, str]]:
    """Each config with ``seeds`` consecutive seeds from its own, and a label for the table."""
    return [(replace(cfg, train=replace(cfg.train, seed=cfg.train.seed + i)), f"config{c}-seed-{cfg.train.seed + i}")
            for c, cfg in enumerate(configs) for i in range(seeds)]


# --- the ledger: what earlier ensembles trained -------------------------------------------------


def read_ledger(out_dir: Path) -> list[dict[str, Any]]:
    """The members ``out_dir``'s ensemble trained, each checkpoint found where the work folder is now."""
    path = Path(out_dir) / LEDGER
    entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    workdir = recorded.workdir_of(Path(out_dir), "ensembles")
    return [{**e, "checkpoint": recorded.located(e["checkpoint"], workdir)} if isinstance(e.get("checkpoint"), str)
            else e for e in entries]


def all_ledgers(workdir: Path) -> list[dict[str, Any]]:
    """The members trained by every ensemble under ``workdir``."""
    return [entry for path in sorted(Workdir(workdir).ensembles.glob(f"*/{LEDGER}"))
            for entry in read_ledger(path.parent)]


Trained = tuple[JobConfig, Path, float | None, str | None]   # config, checkpoint, best valid accuracy, MLflow run


def add_to_ledger(out_dir: Path, trained: Sequence[Trained]) -> None:
    """Append members trained now: config, checkpoint (relative to the work folder when inside it),
    best valid accuracy, MLflow run."""
    workdir = recorded.workdir_of(Path(out_dir), "ensembles")
    ledger = read_ledger(out_dir) + [
        {"config": to_dict(cfg), "checkpoint": str(path), "best_valid_acc": acc, "mlflow_run_id": run_id}
        for cfg, path, acc, run_id in trained]
    ledger = [{**e, "checkpoint": recorded.stored(e["checkpoint"], workdir)} if isinstance(e.get("checkpoint"), str)
              else e for e in ledger]
    atomic_write_text(Path(out_dir) / LEDGER, json.dumps(ledger, indent=1))


# --- reuse -----------------------------------------------------------------------------------------

Found = tuple[Path, str | None, str]      # checkpoint, MLflow run, source
ASHA = "asha"                              # the stop reason of a trial that ASHA stopped


def short_of_budget(trial: TrialRecord) -> str:
    """Why ``trial`` did not train its configuration's whole budget, in words (``stopped by ASHA
    after 1 check``); "" where it did: it finished, and its own loop ended it (its epochs, its
    time or its patience), as it ends the members trained beside it."""
    checks = f"after {trial.checks} check{'' if trial.checks == 1 else 's'}"
    if trial.stop_reason == ASHA:
        return f"stopped by ASHA {checks}"
    if trial.stop_reason == TIME_BUDGET:
        return f"cut by the sweep's time budget {checks}"
    if trial.status != "TERMINATED":
        return f"ended {trial.status} {checks}"
    return ""


def stopped_short(to_train: Sequence[tuple[JobConfig, str]], trials: Sequence[TrialRecord]) -> list[str]:
    """The members to train whose config is a trial's that stopped short of its budget (so it was
    not reused), each as ``config2-seed-0 (trial-0001 stopped by ASHA after 1 check)``."""
    short = {config_key(t.config): f"{t.label} {short_of_budget(t)}" for t in trials
             if t.checkpoint and short_of_budget(t)}
    return [f"{label} ({short[config_key(cfg)]})" for cfg, label in to_train if config_key(cfg) in short]


def reusable(workdir: Path, sweep_folder: Path, trials: Sequence[TrialRecord]) -> dict[str, Found]:
    """Checkpoints on disk by exact config: earlier ensembles' members, then the sweep's own trials
    that trained their whole budget (one stopped short would be averaged and ranked beside seeds
    that trained in full)."""
    found: dict[str, Found] = {}
    for entry in all_ledgers(workdir):
        path = existing(entry.get("checkpoint"), [Path(workdir)])
        if path is not None:
            found[config_key(entry["config"])] = (path, entry.get("mlflow_run_id"), "trained earlier")
    for trial in trials:  # trials win over the ledger: they are the sweep's own runs
        path = existing(trial.checkpoint, [sweep_folder, Path(workdir)])
        if path is not None and not short_of_budget(trial):
            found[config_key(trial.config)] = (path, trial.mlflow_run_id, trial.name or f"trial {trial.trial_id}")
    return found


def record_trained(name: str, out_dir: Path, workdir: Path, configs: Sequence[JobConfig],
                   records: Sequence[TrialRecord], found: dict[str, Found]) -> None:
    """Add the members trained now to ``found`` and to the ledger.

    Raises :class:`IaaError` naming the members that did not finish (no checkpoint, or a trial
    that failed: one that lost its worker with no restores left keeps the checkpoint of a check
    short of its training), after recording the others: running the same command again retrains
    only those.
    """
    trained, failed = [], []
    for cfg, rec in zip(configs, records):
        path = existing(rec.checkpoint, [Path(workdir)])
        if path is None or rec.failed:
            why = ("lost its worker with no restores left" if rec.lost else
                   f"status {rec.status}" + ("" if path is None else ", its checkpoint of an unfinished training"))
            failed.append(f"seed {cfg.train.seed} ({rec.name or f'trial {rec.trial_id}'}, {why})")
            continue
        found[config_key(cfg)] = (path, rec.mlflow_run_id, "trained")
        trained.append((cfg, path, rec.best_valid_acc, rec.mlflow_run_id))
    add_to_ledger(out_dir, trained)
    if failed:
        raise IaaError(f"ensemble {name}: {len(failed)} member(s) did not finish: {'; '.join(failed)}. "
                       "Run the same command again to retry them; the others are kept for reuse.")


def members(wanted: Sequence[tuple[JobConfig, str]], found: Mapping[str, Found]) -> list[Member]:
    out = []
    for cfg, label in wanted:
        path, run_id, source = found[config_key(cfg)]
        out.append(Member(path, cfg, run_id, label, source))
    return out
