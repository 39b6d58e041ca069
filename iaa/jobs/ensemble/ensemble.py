"""``iaa-cli ensemble``: gather members, evaluate them, average them, and track the result.

Members come from one of two places:

- ``--members CKPT ...``: checkpoints used as they are. The data is ``--data``/``--dataset``,
  else the dataset named in the checkpoints' configs (prepared under the workdir).
- ``--sweep NAME``: ``WORKDIR/sweeps/NAME/sweep.json`` (a default name such as ``demo-iaa``
  means the latest ``demo-iaa-<id>``). :mod:`iaa.jobs.ensemble.members` picks its K best configurations
  x N seeds and the checkpoints to reuse; the rest train in parallel as trials of the
  :class:`~iaa.jobs.ports.Launcher` (``train_many``), with the request's workers, GPUs and the
  configs' ``train.threads``.

Every member is evaluated on valid and test with the evaluate job; :mod:`iaa.jobs.evaluation.averaging`
does the alignment, averaging and selection, and fits the temperature that calibrates the
ensemble's probabilities on valid (``calibrate``), which its model answers with. Everything
lands in ``WORKDIR/ensembles/NAME/``, and one MLflow run, open for the whole job, records it
(:mod:`iaa.jobs.ensemble.ensemble_run`; the members it trains nest under it, and it under the
sweep's parent run).
``ensemble.json`` names every member with the sha256 of the file taken when the ensemble first
read it (``member_sha256``); paths inside the work folder are stored relative to it
(:mod:`iaa.jobs.evaluation.ensemble_record`), so the folder means the same wherever it is used or
moved, and a changed member is refused (``iaa.jobs.evaluation.ensemble_record.members``). A
member whose file changes before the end (retrained meanwhile) is refused too, before
``ensemble.json`` is written and again after the model is logged. A finished ensemble is
replaced only with ``overwrite``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from iaa.data.datasets import TRAINING_SPLITS
from iaa.data.shards import file_sha256
from iaa.errors import IaaError
from iaa.jobs import interrupt
from iaa.jobs.ensemble import configurations, ensemble_run, scoring
from iaa.jobs.ensemble.ensemble_result import EnsembleResult, describe, of_record
from iaa.jobs.evaluation import averaging, ensemble_record
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.ensemble import members as ledger
from iaa.jobs.training.loop import LOG_PROGRESS_S
from iaa.jobs.workdir import lock, names
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.sweeps.console import SweepConsole
from iaa.jobs.sweeps.cost import SweepCost, duration
from iaa.jobs.config.job_config import ConfigError, JobConfig, from_dict
from iaa.jobs.ensemble.members import Member
from iaa.jobs.ports import (INTERRUPTED_TAG, MEMBER_KEY, TUNE_RUN_TAG, ConnectRequest, Launcher, MembersRequest, TrackedRun, Tracker,
                            TrialRun, TrialTracking)
from iaa.jobs.evaluation.predictor import SUMMARY
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir

_log = logging.getLogger(__name__)
VOCABULARY_TODO = ("an ensemble's members and the data must share one vocabulary; pass the prepared folder they "
                   "were trained on with `data`")


@dataclass(frozen=True)
class EnsembleRequest:
    """What ``iaa-cli ensemble`` asks for; exactly one of ``sweep`` and ``members``, checked here."""

    sweep: str | None = None
    members: tuple[Path, ...] = ()
    dataset: str | None = None
    data: Path | None = None
    top_configs: int = 1          # K best configurations of the sweep
    seeds: int = 5                # N seeds of each
    select: str = "all"           # all | top-p | greedy, decided on valid
    p: float = 0.5                # fraction kept by top-p
    name: str | None = None
    workdir: Path = Path(DEFAULT_WORKDIR)
    storage_path: str | None = None
    workers_per_trial: int = 1    # Ray Train workers per member trained
    gpus_per_worker: float = 0.0
    show_progress: bool = True
    verbose: bool = False         # Ray Tune's own status tables while members train
    register: str | None = None   # register the ensemble's MLflow model under this name
    overwrite: bool = False       # replace a finished ensemble of the same name
    calibrate: bool = True        # fit the ensemble's temperature on valid (answers unchanged)
    address: str | None = None    # the Ray cluster members train on; None: a local Ray (the resume line names it)
    tracking_uri: str | None = None   # the store given; named in the resume line (the tracker is the caller's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", distinct_members(self.members))
        object.__setattr__(self, "workdir", Path(self.workdir))
        names.folder_name(self.name)
        names.folder_name(self.sweep, "`sweep`")
        names.registered_name(self.register)
        if (self.sweep is None) == (not self.members):
            raise ConfigError("give exactly one of `sweep` NAME or `members` CKPT ...")
        if self.select not in averaging.SELECT_MODES:
            raise ConfigError(f"unknown selection {self.select!r}; choose from {list(averaging.SELECT_MODES)}")
        if self.top_configs < 1 or self.seeds < 1:
            raise ConfigError("`top_configs` and `seeds` must be >= 1")
        if not 0 < self.p <= 1:
            raise ConfigError("`p` must be in (0, 1]")


def distinct_members(members: Sequence[Path]) -> tuple[Path, ...]:
    """The ensemble's checkpoints; ConfigError when one is listed twice (it would count as two members)."""
    seen: dict[Path, Path] = {}
    for member in members:
        key = Path(member).resolve()
        if key in seen:
            raise ConfigError(f"{member}: listed twice in `members` (also as {seen[key]}); an ensemble averages "
                              "distinct checkpoints, so list each once")
        seen[key] = Path(member)
    return tuple(Path(m) for m in members)


def _run_dir_label(checkpoint: Path) -> str:
    """A given member's label: its run folder (``RUN/checkpoints/best.pt``), its sweep and trial (a
    Ray Tune checkpoint, ``ray/SWEEP/TRIAL/checkpoint_000001/checkpoint.pt``), else the file's name."""
    folder = checkpoint.parent
    if folder.name == "checkpoints":
        return folder.parent.name
    if folder.name.startswith("checkpoint_"):
        return f"{folder.parent.parent.name}/{folder.parent.name}"
    return checkpoint.stem


def member_names(ensemble: str, configs: Sequence[JobConfig], top_configs: int, labels: Sequence[str]) -> tuple[str, ...]:
    """Each member's run name, with its seed: ``ENSEMBLE-seed-7``, or ``ENSEMBLE-config1-seed-7``
    when several configurations are kept (``labels``: ``config1-seed-7``)."""
    if top_configs == 1:
        return tuple(f"{ensemble}-seed-{cfg.train.seed}" for cfg in configs)
    return tuple(f"{ensemble}-{label}" for label in labels)


def given_members(paths: Sequence[Path], tracker: Tracker) -> list[Member]:
    """Checkpoints as they are, each linked to the tracked run whose ``checkpoint`` tag names it."""
    from iaa.jobs.modeling import checkpoint

    members = []
    for path in map(Path, paths):
        sha256 = file_sha256(path)                       # before its first read
        state = checkpoint.load(path)
        run_id = tracker.find_by_tag("checkpoint", [str(path), str(path.resolve())])
        members.append(Member(path, from_dict(state["config"]), run_id, _run_dir_label(path), "given", sha256,
                              str(state.get("vocab_hash", ""))))
    labels = [m.label for m in members]
    return [replace(m, label=f"{m.label} ({i + 1})") if labels.count(m.label) > 1 else m for i, m in enumerate(members)]


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
        interrupt.on_stop(lambda signal_name: _end_members(tracker, trials_to.experiment, run_name, signal_name))
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


def _end_members(tracker: Tracker, experiment: str, group: str, signal_name: str) -> None:
    """A stop while members train: their runs still RUNNING (tagged with their Tune run, ``group``)
    end KILLED, tagged ``interrupted``."""
    for found in tracker.find_runs(experiment, {TUNE_RUN_TAG: group}, status="RUNNING"):
        run = tracker.attach(found.run_id)
        run.set_tags({INTERRUPTED_TAG: signal_name})
        run.end("KILLED")


def _end_run(run: TrackedRun, signal_name: str) -> None:
    """A stop: the ensemble's own run ends KILLED, tagged ``interrupted``, unless it has ended."""
    if run.status() == "RUNNING":
        run.set_tags({INTERRUPTED_TAG: signal_name})
        run.end("KILLED")


def resume_command(req: EnsembleRequest) -> Command:
    """The command that continues a stopped ensemble: the same one, which reuses every member
    already trained."""
    return Command.of("ensemble", sweep=req.sweep, members=() if req.sweep else tuple(req.members),
                      dataset=req.dataset, data=req.data,
                      top_configs=req.top_configs if req.sweep else None, seeds=req.seeds if req.sweep else None,
                      select=req.select, p=f"{req.p:g}" if req.select == "top-p" else None, name=req.name,
                      workers_per_trial=req.workers_per_trial if req.workers_per_trial != 1 else None,
                      gpus_per_worker=f"{req.gpus_per_worker:g}" if req.gpus_per_worker else None,
                      storage_path=req.storage_path, address=req.address, register=req.register,
                      no_calibrate=not req.calibrate, **where(req.workdir, req.tracking_uri))


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
    from iaa.data.manifest import counted

    rows = counted(prepared, "train")
    cost = SweepCost(trials=len(configs), epochs=max(c.train.max_epochs for c in configs), examples=rows,
                     examples_per_s=0.0, concurrency=len(configs), gpus=req.gpus_per_worker > 0)
    return SweepConsole(cost, (), label=lambda params: f"member {labels[int(params[MEMBER_KEY])]}",
                        what="training members")


def sweep_store(workdir: Path, name: str | None) -> str | None:
    """The MLflow store that sweep ``name`` recorded (None: no sweep, or no record to read, which
    :func:`read_sweep` reports): an ensemble of it is tracked there, beside the sweep's runs."""
    if not name:
        return None
    try:
        return sweep_file.read(sweep_file.find(workdir, name)).tracking_uri
    except IaaError:
        return None


def sweep_ensemble_name(sweep: str, top_configs: int, select: str) -> str:
    """An ensemble of a sweep's default name: the sweep's, and ``-topK`` and ``-SELECT`` where they
    are not the defaults (1, all), so that ensembles of one sweep built otherwise do not collide."""
    return sweep + (f"-top{top_configs}" if top_configs > 1 else "") + (f"-{select}" if select != "all" else "")


def read_sweep(workdir: Path, name: str) -> SweepRecord:
    """The sweep ``name`` (or the latest of a default-named prefix), with at least one trial."""
    path = sweep_file.find(workdir, name)
    sweep = sweep_file.read(path)
    if not sweep.trials:
        raise IaaError(f"sweep {name!r} has no trials in {path}")
    return sweep


# --- evaluation and tracking -------------------------------------------------------------------


def _has_split(prepared: Path, split: str) -> bool:
    from iaa.data.loader import PreparedData

    data = PreparedData.open(Path(prepared))
    return split in data.splits and data.table(split).num_rows > 0


def evaluate_members(members: Sequence[Member], prepared: Path, out_dir: Path, show_progress: bool) -> list[dict[str, Path | None]]:
    """Each member's predictions files on valid and (where the data has it) test."""
    from tqdm import tqdm

    from iaa.jobs.evaluation import evaluate

    splits = ["valid"] + (["test"] if _has_split(prepared, "test") else [])
    sizes = scoring.split_sizes(prepared)
    files: list[dict[str, Path | None]] = []
    terminal = sys.stderr.isatty()    # a log file or a pipe gets the bar at its start, every 30 s and its end
    bar = tqdm(total=len(members) * sum(sizes[s] for s in splits), desc="evaluate members", unit="q",
               disable=not show_progress, file=sys.stderr, mininterval=0.1 if terminal else LOG_PROGRESS_S)
    for i, member in enumerate(members):
        entry: dict[str, Path | None] = {"valid": None, "test": None}
        for split in splits:
            out = out_dir / "members" / f"{i:02d}-{split}.parquet"
            bar.set_postfix_str(f"member {i + 1}/{len(members)} {split}", refresh=terminal)
            entry[split] = Path(evaluate.run(member.checkpoint, prepared, split, out, progress=bar.update).predictions)
        files.append(entry)
    bar.close()
    return files


def _check_free(out_dir: Path, name: str, overwrite: bool) -> None:
    """Refuse to replace a finished ensemble (one with ``ensemble.json``) unless ``overwrite``.

    A folder without it is an unfinished ensemble of this name (its ``trained.json`` lists the
    members trained so far): it is continued.
    """
    if (out_dir / SUMMARY).exists() and not overwrite:
        raise IaaError(f"{out_dir}: an ensemble named {name!r} exists already; add `overwrite` to replace it, "
                       "or choose another `name` (nothing was changed)")


def run(req: EnsembleRequest, tracker: Tracker, launcher: Launcher | None = None) -> EnsembleResult:
    """Build, evaluate and score the ensemble that ``req`` describes; see the module docstring.

    Returns:
        The :class:`~iaa.jobs.ensemble.ensemble_result.EnsembleResult`: what ``ensemble.json``
        records, with the logged model and the next commands. SIGINT or SIGTERM raises
        :class:`iaa.jobs.interrupt.Interrupted` (its runs KILLED; the members trained are kept).
    """
    with (interrupt.stoppable(resume_command(req), kept=lambda: "kept every member trained so far (reused on a rerun)"),
          contextlib.ExitStack() as held):
        return _run(req, tracker, launcher, held)


@dataclass(frozen=True)
class Settled:
    """What an ensemble's inputs settle to before its run opens: the sweep (None for given
    members) or the given members, the data, the ensemble's name, folder and experiment, and the
    most-frequent-candidate accuracies beside which its own are shown (``baseline_valid_acc``
    and, where the data has a test split, ``baseline_test_acc``)."""

    sweep: SweepRecord | None
    given: tuple[Member, ...]
    dataset: str
    prepared: Path
    name: str
    out_dir: Path
    experiment: str
    baselines: dict[str, float]


def settle(req: EnsembleRequest, tracker: Tracker, launcher: Launcher | None) -> Settled:
    """Read and check every input before the ensemble's run opens, so that a refused command
    leaves no run behind: the sweep or the given checkpoints, the data (every member given or
    reused was trained on its vocabulary), the folder (free, unless ``overwrite``), the cluster
    the members left to train join, and the baseline's accuracies."""
    from iaa.jobs.datasets import resolve

    if req.sweep is None:
        given, dataset, prepared, name, out_dir = _given_ensemble(req, tracker)
        return Settled(None, tuple(given), dataset, prepared, name, out_dir, f"ensemble-{dataset}",
                       scoring.baselines(prepared))
    sweep = read_sweep(req.workdir, req.sweep)
    if req.dataset is None and req.data is None and sweep.data_dir:
        dataset, prepared = resolve.data_dir(None, Path(sweep.data_dir), req.workdir, splits=TRAINING_SPLITS)
    else:
        dataset, prepared = resolve.data_dir(req.dataset or sweep.dataset, req.data, req.workdir,
                                             splits=TRAINING_SPLITS)
    name = req.name or sweep_ensemble_name(sweep.name, req.top_configs, req.select)
    out_dir = Workdir(req.workdir).ensemble(name)
    _check_free(out_dir, name, req.overwrite)
    wanted, found, _, _ = _wanted(req, sweep)
    reused = {found[key][0] for key in (ledger.config_key(cfg) for cfg, _ in wanted) if key in found}
    check_vocabulary([(path, _vocab_hash(path)) for path in sorted(reused)], prepared)
    check_cluster(req, sweep, prepared, launcher)
    return Settled(sweep, (), dataset, prepared, name, out_dir, sweep.experiment or f"ensemble-{dataset}",
                   scoring.baselines(prepared))


def _vocab_hash(path: Path) -> str:
    """The vocabulary a checkpoint was trained on (its hash; "" for an older checkpoint)."""
    from iaa.jobs.modeling import checkpoint

    return str(checkpoint.load(path).get("vocab_hash", ""))


def check_vocabulary(members: Sequence[tuple[Path, str]], prepared: Path) -> None:
    """Refuse a member (a checkpoint and its vocabulary's hash) trained on another vocabulary
    than the prepared data's: its word ids would mean other words there."""
    from iaa.data.loader import PreparedData
    from iaa.jobs.modeling import checkpoint

    data_hash = PreparedData.open(Path(prepared)).manifest.vocab_hash
    for path, vocab_hash in members:
        checkpoint.check_vocab({"vocab_hash": vocab_hash}, data_hash, path, prepared, VOCABULARY_TODO)


def _run(req: EnsembleRequest, tracker: Tracker, launcher: Launcher | None,
         held: contextlib.ExitStack) -> EnsembleResult:
    settled = settle(req, tracker, launcher)
    sweep, dataset, prepared, name = settled.sweep, settled.dataset, settled.prepared, settled.name
    out_dir, experiment, uri = settled.out_dir, settled.experiment, tracker.uri
    held.enter_context(lock.held(lock.beside(out_dir), busy=lambda pid: IaaError(
        f"the ensemble {name} is being built by another process (pid {pid}); let it end, or stop it there, then "
        f"run the same command again: it reuses every member trained")))

    # The run opens now: it lasts as long as the job, and the members trained nest under it,
    # as the ensemble nests under its sweep's run.
    parent = sweep.parent_run_id if sweep is not None else None
    with tracker.run(experiment, f"ensemble-{name}", tags=ensemble_run.run_tags(dataset, req.select, out_dir, sweep),
                     parent_run_id=parent) as run:
        interrupt.on_stop(lambda signal_name: _end_run(run, signal_name))   # a second signal skips the block's end
        members = (sweep_members(req, sweep, prepared, out_dir, tracker, name, launcher, run_id=run.run_id)
                   if sweep is not None else list(settled.given))
        members = [ledger.first_read(m) for m in members]
        sizes = scoring.split_sizes(prepared)
        if req.show_progress:
            _log.info(scoring.cost_line(len(members), sizes, name))

        files = evaluate_members(members, prepared, out_dir, req.show_progress)
        labels = [f"{m.label} ({m.source})" if m.source != "given" else m.label for m in members]
        result = averaging.run(files, [str(m.checkpoint) for m in members], out_dir, select_mode=req.select,
                               p=req.p, labels=labels, calibrate=req.calibrate)
        ledger.check_unchanged(members, name)
        summary = {**result.fields(), "name": name, "dataset": dataset, "data_dir": str(prepared),
                   "ensemble_dir": str(out_dir), "member_labels": labels, "member_run_ids": [m.mlflow_run_id for m in members],
                   "sweep": req.sweep, "tracking_uri": uri, "mlflow_run_id": run.run_id,
                   "member_sha256": {str(m.checkpoint): m.sha256 for m in members}, "calibrate": req.calibrate}
        summary.update({**scoring.accuracy_keys(summary, sizes), **settled.baselines})
        ranked = (configurations.scores([m.config for m in members], result.member_valid_acc, sweep.trials)
                  if sweep is not None and req.top_configs > 1 else [])
        lead = configurations.lead(ranked)
        if len(ranked) > 1:
            summary.update(configurations=[c.fields() for c in ranked],
                           configuration_lead=None if lead is None else lead.fields())
        ensemble_record.write(out_dir, ensemble_record.EnsembleRecord.from_json(summary))
        settings = {"select": req.select, "p": req.p, "top_configs": req.top_configs, "seeds": req.seeds,
                    "calibrate": req.calibrate,
                    "sweep": req.sweep or "", "n_members": len(members), "n_selected": len(result.selected)}
        about = ensemble_run.card(summary, members, result, experiment)
        summary["model_uri"] = ensemble_run.record(run, tracker, settings, members, result, out_dir, prepared,
                                                   req.register, about, baselines=settled.baselines)
        ledger.check_unchanged(members, name)           # the logged model copied the members read first
    if sweep is not None:
        ensemble_run.count_on_sweep(tracker, experiment, sweep)
    ensemble_record.write(out_dir, ensemble_record.EnsembleRecord.from_json(summary))
    table = result.table
    result = of_record(summary, req)
    _log.info(table)
    if len(ranked) > 1:
        _log.info(configurations.lines(ranked, lead))
    _log.info(describe(result))
    return result


def _given_ensemble(req: EnsembleRequest, tracker: Tracker) -> tuple[list[Member], str, Path, str, Path]:
    """``--members``: the members, their dataset and prepared folder (one dataset, unless
    ``--data``/``--dataset`` names it), the ensemble's name (default: dataset, size, selection and
    a digest of the members' paths) and its free output folder."""
    from iaa.jobs.datasets import resolve

    members = given_members(req.members, tracker)
    named = sorted({m.config.dataset for m in members})
    if req.dataset is None and req.data is None and len(named) > 1:
        raise ConfigError(f"the members were trained on different datasets {named}; pass `data` or `dataset`")
    dataset, prepared = resolve.data_dir(req.dataset or named[0], req.data, req.workdir, splits=("valid",))
    check_vocabulary([(m.checkpoint, m.vocab_hash) for m in members], prepared)
    digest = hashlib.sha1("\n".join(str(Path(p).resolve()) for p in req.members).encode()).hexdigest()[:8]
    name = req.name or f"{dataset}-{len(members)}members-{req.select}-{digest}"
    out_dir = Workdir(req.workdir).ensemble(name)
    _check_free(out_dir, name, req.overwrite)
    return members, dataset, prepared, name, out_dir
