"""Training a sweep ensemble's missing members: which of the K best configurations x N seeds are
left to train (:mod:`iaa.jobs.ensemble.members` finds the checkpoints to reuse), the cluster they
join, what they cost, their console, and the trials of the :class:`~iaa.jobs.ports.Launcher`
(``train_many``) that train them in parallel, with the request's workers, GPUs and the configs'
``train.threads``. Their runs nest under the ensemble's run; a stop ends those still running
KILLED, and the members trained so far stay recorded in the ensemble's ledger for a rerun.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Sequence

from iaa.errors import IaaError
from iaa.jobs import interrupt
from iaa.jobs.config.job_config import JobConfig
from iaa.jobs.ensemble import members as ledger
from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
from iaa.jobs.ensemble.members import Member
from iaa.jobs.ports import (INTERRUPTED_TAG, MEMBER_KEY, TUNE_RUN_TAG, ConnectRequest, Launcher, MembersRequest, Tracker,
                            TrialRun, TrialTracking)
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.console import SweepConsole
from iaa.jobs.sweeps.cost import SweepCost, duration
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.workdir.paths import Workdir

_log = logging.getLogger(__name__)
KEPT = "kept the members whose training finished (reused on a rerun)"    # what a stopped sweep ensemble leaves


def _wanted(req: EnsembleRequest, sweep: SweepRecord) -> tuple[list[tuple[JobConfig, str]], dict[str, Any],
                                                                 list[JobConfig], list[str]]:
    """The members the ensemble wants (K best configurations x N seeds, labelled), the checkpoints
    it finds for some, and the configurations (and labels) left to train."""
    trials = list(sweep.trials)
    workdir = Workdir(req.workdir)
    found = ledger.reusable(workdir.root, workdir.sweep(sweep.name), trials)
    wanted = ledger.seeded(ledger.best_configs(sweep.name, trials, req.top_configs), req.seeds)
    to_train = [cfg for cfg, _ in wanted if ledger.config_key(cfg) not in found]
    labels = [label for cfg, label in wanted if ledger.config_key(cfg) not in found]
    return wanted, found, to_train, labels


def _connection(req: EnsembleRequest, name: str, prepared: Path, to_train: Sequence[JobConfig],
                show_progress: bool) -> ConnectRequest:
    """How the members to train are placed on the cluster (one Tune run named ``name``)."""
    return ConnectRequest(name=name, prepared=prepared, storage=Workdir(req.workdir).storage(req.storage_path),
                          num_trials=len(to_train), workers_per_trial=req.workers_per_trial,
                          gpus_per_worker=req.gpus_per_worker, threads=max(c.train.threads for c in to_train) or None,
                          show_progress=show_progress)


def check_cluster(req: EnsembleRequest, sweep: SweepRecord, prepared: Path, launcher: Launcher | None) -> None:
    """Join the cluster the members left to train will run on, before the ensemble's run opens: an
    unreachable address or storage the nodes cannot share fails here, leaving no FAILED run."""
    _, _, to_train, _ = _wanted(req, sweep)
    if to_train and launcher is not None:
        launcher.connect(_connection(req, f"ensemble-{sweep.name}", prepared, to_train, show_progress=False))


def reused_checkpoints(req: EnsembleRequest, sweep: SweepRecord) -> list[Path]:
    """The checkpoints the ensemble reuses as members (of the sweep's trials, or trained by an
    earlier ensemble), sorted."""
    wanted, found, _, _ = _wanted(req, sweep)
    return sorted({found[key][0] for key in (ledger.config_key(cfg) for cfg, _ in wanted) if key in found})


def member_names(ensemble: str, configs: Sequence[JobConfig], top_configs: int, labels: Sequence[str]) -> tuple[str, ...]:
    """Each member's run name, with its seed: ``ENSEMBLE-seed-7``, or ``ENSEMBLE-config1-seed-7``
    when several configurations are kept (``labels``: ``config1-seed-7``)."""
    if top_configs == 1:
        return tuple(f"{ensemble}-seed-{cfg.train.seed}" for cfg in configs)
    return tuple(f"{ensemble}-{label}" for label in labels)


def sweep_members(req: EnsembleRequest, sweep: SweepRecord, prepared: Path, out_dir: Path, tracker: Tracker,
                  name: str, launcher: Launcher | None, run_id: str | None = None) -> list[Member]:
    """K best configurations x N seeds, reusing matching checkpoints and training the rest as trials,
    whose runs nest under the ensemble's run ``run_id`` and carry the sweep's name."""
    wanted, found, to_train, labels = _wanted(req, sweep)
    if to_train:
        from iaa.jobs.training.loop import fit_on_worker

        if launcher is None:
            raise IaaError(f"{len(to_train)} members must be trained, and no launcher was given")
        _log.info(training_line(len(wanted) - len(to_train), ledger.stopped_short(list(zip(to_train, labels)),
                                                                                  sweep.trials), len(to_train))
                  + f"; {members_cost(sweep, len(to_train))}")
        run_name = sweep_file.unique_name(f"ensemble-{name}")
        trials_to = TrialTracking(tracker=tracker, experiment=sweep.experiment or f"ensemble-{sweep.dataset}",
                                  parent_run_id=run_id, sweep=sweep.name, dataset=to_train[0].dataset,
                                  data_dir=prepared, member_names=member_names(name, to_train, req.top_configs, labels))
        console = member_console(to_train, labels, prepared, req) if req.show_progress else None
        started = time.monotonic()
        connection = _connection(req, run_name, prepared, to_train, req.show_progress)

        def stopped(signal_name: str) -> None:
            _keep_finished(tracker, trials_to, run_name, to_train, out_dir, Path(req.workdir))
            _end_members(tracker, trials_to.experiment, run_name, signal_name)

        interrupt.on_stop(stopped)
        trained = launcher.train_many(MembersRequest(
            configs=tuple(to_train), connection=connection,
            trials=TrialRun(fit=fit_on_worker, tracking=trials_to, downloads=out_dir / "checkpoints", console=console,
                            verbose=req.verbose),
        ))
        if console is not None:
            _log.info(console.summary(time.monotonic() - started))
        ledger.record_trained(name, out_dir, Path(req.workdir), to_train, trained, found)
    return ledger.members(wanted, found)


def training_line(reused: int, short: Sequence[str], to_train: int) -> str:
    """What the ensemble reuses and trains, naming the members trained in place of sweep trials that
    stopped short of their budget (``short``: :func:`iaa.jobs.ensemble.members.stopped_short`)."""
    line = (f"ensemble: reusing {reused} checkpoint{'' if reused == 1 else 's'}, training {to_train} "
            f"member{'' if to_train == 1 else 's'} on Ray")
    if short:
        line += (f", {len(short)} of them in full in place of the sweep's trial of their config, which stopped "
                 f"short of its budget: {'; '.join(short)}")
    return line


def _keep_finished(tracker: Tracker, trials_to: TrialTracking, group: str, to_train: Sequence[JobConfig],
                   out_dir: Path, workdir: Path) -> None:
    """A stop while members train: the members whose runs (tagged with their Tune run, ``group``)
    finished with a checkpoint on disk go to the ledger, so that running the command again reuses
    them (the ledger is otherwise written once every member has ended)."""
    by_name = dict(zip(trials_to.member_names, to_train))
    kept: list[ledger.Trained] = []
    for found in tracker.find_runs(trials_to.experiment, {TUNE_RUN_TAG: group}, status="FINISHED"):
        cfg = by_name.get(found.tags.get("member", ""))
        path = ledger.existing(found.tags.get("checkpoint"), [Path(workdir)])
        if cfg is not None and path is not None:
            best = tracker.metric_history(found.run_id, "best_valid_acc")
            kept.append((cfg, path, best[-1].value if best else None, found.run_id))
    if kept:
        ledger.add_to_ledger(out_dir, kept)


def _end_members(tracker: Tracker, experiment: str, group: str, signal_name: str) -> None:
    """A stop while members train: their runs still RUNNING (tagged with their Tune run, ``group``)
    end KILLED, tagged ``interrupted``."""
    for found in tracker.find_runs(experiment, {TUNE_RUN_TAG: group}, status="RUNNING"):
        run = tracker.attach(found.run_id)
        run.set_tags({INTERRUPTED_TAG: signal_name})
        run.end("KILLED")


def members_cost(sweep: SweepRecord, members: int) -> str:
    """What training ``members`` members costs, in words, from what the sweep's trials took: its
    seconds per training step (its wall time over the steps its trials made, as many at a time
    as it ran) times the steps of its longest trial, in as many waves as the sweep ran trials."""
    steps = sum(t.steps for t in sweep.trials)
    longest = max((t.steps for t in sweep.trials), default=0)
    if not (sweep.wall_s > 0 and steps > 0):
        return "the sweep recorded no time to estimate their cost from"
    ran = max(sweep.max_concurrent or 1, 1)
    per_member = sweep.wall_s * ran / steps * longest
    at_once = min(ran, max(members, 1))
    waves = -(-members // ran)
    pace = f"at {at_once} at a time, as the sweep ran its trials" if at_once > 1 else "one at a time"
    return (f"about {duration(per_member * waves)} {pace} "
            f"({duration(per_member)} a member: its longest trial's {longest} steps at its pace)")


def member_console(configs: Sequence[JobConfig], labels: Sequence[str], prepared: Path,
                   req: EnsembleRequest) -> SweepConsole:
    """The console of the members being trained (``labels``: ``config0-seed-1``, ...): one line per
    member event and an ETA, as a sweep's."""
    from iaa.data.prepared.manifest import counted

    rows = counted(prepared, "train")
    cost = SweepCost(trials=len(configs), epochs=max(c.train.max_epochs for c in configs), examples=rows,
                     examples_per_s=0.0, concurrency=len(configs), gpus=req.gpus_per_worker > 0)
    return SweepConsole(cost, (), label=lambda params: f"member {labels[int(params[MEMBER_KEY])]}",
                        what="training members")
