"""``iaa-cli train``: one reader trained in this process or on Ray Train workers, tracked as one
run with its model logged at the end.

The request is settled first (the data, the config from the preset, a config file and ``--set``
or, for a resume, from its checkpoint, the run folder, never over an input) into one
:class:`~iaa.jobs.ports.TrainRun`; then the loop of :mod:`iaa.jobs.training.loop` runs in a
:class:`~iaa.jobs.training.session.LocalSession` (``run``) or on the launcher's workers
(``fit_on_worker``), and the result is logged with the most-frequent-candidate baseline beside it
(:func:`run_tracked`). A resumed run continues the tracked run its folder had; a resume that its
checkpoint refuses is refused before that run is reopened.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping


from iaa.data.datasets import TRAINING_SPLITS
from iaa.errors import IaaError
from iaa.jobs import interrupt
from iaa.jobs.modeling import checkpoint
from iaa.jobs.modeling import precision_policy as precision
from iaa.jobs.config.job_config import ConfigError, JobConfig, from_dict, to_dict
from iaa.jobs.ports import (INTERRUPTED_TAG, Launcher, MetricsCallback, ModelFiles, RestoresSpent, TrackedRun, Tracker,
                            TrainRun, TrainWorkflow, WorkersRequest, trial_said)
from iaa.jobs.evaluation import model_card
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.evaluation.predictor import MODEL_CODE
from iaa.jobs.training import summary
from iaa.jobs.training.summary import TrainResult, trained
from iaa.jobs.training.step import retain_freed_memory
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, RunFolder, Workdir
from iaa.jobs.training.loop import fit, fit_on_worker
from iaa.jobs.train import continuity, trained_on

_log = logging.getLogger(__name__)

# What a resume is held to, read from the checkpoint it goes on from (:func:`resume_point`): the
# checkpoint's config and vocabulary digest, and its file.
ResumePoint = tuple[Mapping[str, Any], Path]
RESUME_KEYS = ("config", "vocab_hash")


def run(
    cfg: JobConfig,
    data_dir: Path,
    run_dir: Path,
    *,
    resume: bool = False,
    on_metrics: MetricsCallback | None = None,
    show_progress: bool = True,
    device: str = "cpu",
    train_rows: Any = None,
) -> TrainResult:
    """Train in this process; returns the metrics with the best checkpoint's path.

    ``train_rows`` (a pyarrow Table in the shards' schema, e.g. with a teacher column) replaces
    the prepared training split. An entry point: it opts this process into
    ``retain_freed_memory`` (faster CPU steps).
    """
    from iaa.jobs.training.session import LocalSession

    retain_freed_memory()
    session = LocalSession(data_dir, run_dir, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                           resume=resume, on_metrics=on_metrics, device=device, train_rows=train_rows)
    result = fit(cfg, session, show_progress=show_progress, vocab_hash=session.data.manifest.vocab_hash)
    return trained(result, checkpoint=str(Path(session.best_checkpoint).resolve()), run_dir=str(Path(run_dir).resolve()))


def run_tracked(train_run: TrainRun, tracker: Tracker, launcher: Launcher | None = None, *,
                point: ResumePoint | None = None) -> TrainResult:
    """``iaa-cli train``'s workflow: one run, in this process (``workers == 0``) or on the
    launcher's workers, tracked in ``tracker``, with its model logged at the end. With its store
    bound (:func:`tracked_in`) it is the :class:`~iaa.jobs.ports.TrainWorkflow` that distillation
    trains its student with.

    1. The tracked run it goes on in: a resume continues the one its run folder had
       (:func:`~iaa.jobs.train.continuity.continued`); a resume is held to its checkpoint before
       that run reopens, so a refused one leaves it as it was (``point``: what the caller read of
       that checkpoint already, :func:`resume_point`); a fresh start replaces the attempts stopped
       in its folder before their first check.
    2. The run opened (:func:`_opened`): a new one gets its inputs, a continued one the settings
       the resume changed.
    3. The loop (:func:`_fit`), then the most-frequent-candidate baseline beside its best accuracy
       (:func:`~iaa.jobs.training.summary.with_baseline`).
    4. The result logged (:func:`_log_result`), unless a resume found nothing left to train.

    Of ``train_run``: ``train_rows`` (a pyarrow Table) replaces the prepared training split, in
    process only: the distillation job passes the rows with their teacher distributions, and
    ``teacher`` (the teacher's Parquet file) is then logged as an input of the run.
    ``experiment`` is the MLflow experiment of the run (default ``train-DATASET``; distillation's
    is ``distill-ENSEMBLE``).
    """
    if train_run.workers > 0 and launcher is None:
        raise IaaError("training on workers needs a launcher")
    if train_run.train_rows is not None and train_run.workers > 0:
        raise ValueError("training on given rows (distillation) runs in process, not on Ray Train workers")
    folder = RunFolder(Path(train_run.run_dir))
    experiment = train_run.experiment or f"train-{train_run.cfg.dataset}"
    follows = continuity.continued(tracker, experiment, folder) if train_run.resume else continuity.Continuation()
    # auto -> fp32 or bf16 here, once, where this process can decide it for the workers' device:
    # the tracked params record it and every worker uses it; the run's precision tag says what ran
    train_run = replace(train_run, cfg=precision.resolved_once(train_run.cfg, gpus=train_run.gpus_per_worker > 0))
    if train_run.resume:                # before its run reopens: a refused resume leaves it as it was
        changes = check_resumable(point or resume_point(folder), train_run.cfg, train_run.prepared)
    else:
        changes = {}
        continuity.drop_stopped_attempts(tracker, experiment, folder)
    with tracker.run(experiment, folder.path.name, tags={**_tags(train_run, folder), **follows.tags()},
                     resume_id=follows.run_id) as tracked:
        interrupt.on_stop(lambda signal_name: _killed(tracked, signal_name))
        folder.track(tracker.uri, tracked.run_id)
        log = _opened(tracked, train_run, folder, follows, changes)
        result = summary.with_baseline(_fit(train_run, folder, launcher, log), train_run.prepared)
        if follows.run_id is not None and result.metrics.get("trained_steps") == 0 and not train_run.register:
            # a resume of a run that had already stopped: its model and final figures are logged
            _log.info(f"nothing left to train: {folder.path} had already stopped ({result.stop_reason}); "
                      "nothing new is logged")
            model_uri = tracker.model_uri(tracked.run_id)
        else:
            model_uri = _log_result(tracker, tracked, result, train_run, experiment)
    return replace(result, model_uri=model_uri, tracking_uri=tracker.uri, mlflow_run_id=tracked.run_id)


def tracked_in(tracker: Tracker) -> TrainWorkflow[TrainResult]:
    """The training workflow that tracks its runs in ``tracker``: :func:`run_tracked` with its
    store bound, in this process (distillation's student)."""
    return partial(run_tracked, tracker=tracker)


def _tags(train_run: TrainRun, folder: RunFolder) -> dict[str, str]:
    """The run's tags: its dataset, model, run folder (absolute) and workers, and those it is given."""
    return {"dataset": train_run.cfg.dataset, "model": train_run.cfg.model.kind,
            "run_dir": str(folder.path.resolve()), "workers": str(train_run.workers), **train_run.tags}


def _opened(tracked: TrackedRun, train_run: TrainRun, folder: RunFolder, follows: continuity.Continuation,
            changes: Mapping[str, Any]) -> MetricsCallback:
    """The opened run, before the loop: a new one gets its inputs (a copy's own run, the checks
    the copy holds too), a continued one where its folder is now and the settings the resume
    changed (``changes``). Returns what logs each check at its step."""
    log = lambda metrics: tracked.log_metrics(metrics, step=int(metrics.get("step", 0)))  # noqa: E731
    if follows.run_id is None:
        _log_inputs(tracked, train_run.cfg, train_run.prepared, train_run.teacher)
        if follows.copy_of is not None:
            continuity.replay_checks(folder, log)
    else:
        tracked.set_tags({"run_dir": str(folder.path.resolve()), **continuity.resumed_tags(changes)})
    return log


def _log_inputs(tracked: TrackedRun, cfg: JobConfig, prepared: Path, teacher: Path | None) -> None:
    """A new run's inputs: the whole config as params, the prepared data and the teacher's file."""
    tracked.log_params(to_dict(cfg))
    tracked.log_dataset(prepared)
    if teacher is not None:
        tracked.log_file_input(Path(teacher), context="teacher")


def _log_result(tracker: Tracker, tracked: TrackedRun, result: TrainResult, train_run: TrainRun,
                experiment: str) -> str | None:
    """The finished run's checkpoint (absolute) and precision tags, its description, the size of the
    valid split its accuracy was measured on (``best_valid_acc_n``), that accuracy's standard error
    and the baseline beside it, its logged model (registered as ``register``, with a card saying
    what it is; its URI is returned) and its final best validation accuracy."""
    checkpoint = str(Path(result.checkpoint).resolve()) if result.checkpoint else ""
    tracked.set_tags({"checkpoint": checkpoint, **({"precision": result.precision} if result.precision else {}),
                      "mlflow.note.content": summary.run_note(result, checkpoint)})
    if result.best_valid_acc_n is not None:
        tracked.log_params({"best_valid_acc_n": result.best_valid_acc_n})
    best = result.best_valid_acc if result.best_valid_acc is not None else 0.0
    figures = {"final_best_valid_acc": best, "best_valid_acc_stderr": result.best_valid_acc_stderr,
               "baseline_valid_acc": result.baseline_valid_acc}
    model_uri = None
    if result.checkpoint:
        cfg = train_run.cfg
        card = model_card.card(kind="reader", model=cfg.model.kind, dataset=cfg.dataset,
                               valid_acc=result.best_valid_acc, n=int(result.best_valid_acc_n or 0),
                               baseline=result.baseline_valid_acc,
                               origin=f"Trained by run {Path(result.run_dir).name} ({tracked.run_id}) of experiment "
                                      f"{experiment}; its checkpoint is `{checkpoint}`.")
        model_uri = tracker.log_model(tracked, ModelFiles.of(result.checkpoint, train_run.prepared),
                                      train_run.register, code=MODEL_CODE, card=card)
    tracked.log_metrics({k: v for k, v in figures.items() if v is not None}, step=int(result.steps))
    return model_uri


def _fit(train_run: TrainRun, folder: RunFolder, launcher: Launcher | None, log: MetricsCallback) -> TrainResult:
    """Train in this process (``workers <= 0``) or on the launcher's Ray Train workers; returns the
    metrics with the best checkpoint's path."""
    if train_run.workers <= 0:
        device = "cuda" if train_run.gpus_per_worker > 0 else "cpu"  # in process: gpus_per_worker > 0 means this GPU
        return run(train_run.cfg, train_run.prepared, folder.path, resume=train_run.resume, on_metrics=log,
                   show_progress=train_run.show_progress, device=device, train_rows=train_run.train_rows)
    assert launcher is not None
    return trained(launcher.train_workers(WorkersRequest(
        cfg=train_run.cfg, prepared=train_run.prepared, folder=folder, fit=fit_on_worker, workers=train_run.workers,
        storage=train_run.storage, gpus_per_worker=train_run.gpus_per_worker, resume=train_run.resume,
        on_metrics=log, show_progress=train_run.show_progress)))


@dataclass(frozen=True)
class TrainRequest:
    """What ``iaa-cli train`` asks for: the data (``dataset`` or a prepared ``data`` folder), the
    config (model kind, YAML file, ``--set`` overrides), the run folder and where it trains."""

    dataset: str | None
    data: Path | None
    model_kind: str | None = None
    config_file: Path | None = None
    sets: tuple[str, ...] = ()
    run_dir: Path | None = None              # default: WORKDIR/runs/DATASET-MODEL-seedN
    resume: bool = False
    overwrite: bool = False
    register: str | None = None
    workers: int = 0                         # Ray Train workers; 0 trains in this process
    gpus_per_worker: float = 0.0
    tracking_uri: str | None = None
    storage_path: str | None = None
    address: str | None = None               # the Ray cluster of the workers; None: a local one
    workdir: Path = Path(DEFAULT_WORKDIR)
    show_progress: bool = True

    def __post_init__(self) -> None:
        from iaa.jobs.workdir import names

        names.registered_name(self.register)


def run_request(req: TrainRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher | None) -> TrainResult:
    """``iaa-cli train``: resolve the data, config and run folder (never over an input; a resume
    goes on with its checkpoint's config, :func:`resumed_config`), claim the folder and train tracked in the
    store ``open_tracker(uri)``; the result carries the baseline and the next commands."""
    from iaa.jobs.workdir import outputs, rundir
    from iaa.jobs.datasets import resolve

    work = Workdir(req.workdir)
    work.writable()
    uri = work.tracking_uri(req.tracking_uri)
    dataset, data, handoff = data_of(req)
    name, prepared = resolve.data_dir(dataset, data, req.workdir, splits=TRAINING_SPLITS)
    if req.resume and req.data is None and req.dataset is None:
        req = replace(req, data=prepared)       # a stop's lines name the data the resume found
    cfg = resolve.job_config(name, prepared, model_kind=req.model_kind, config_file=req.config_file, sets=req.sets)
    if "sweep" in handoff:                      # on stderr, with --json too: what this run is
        _log.info(best_config_notice(handoff["sweep"], cfg))
    few = few_checks_warning(cfg, prepared, req.workers)
    if few:
        _log.warning(few)
    run_dir = resolve.run_dir(name, cfg, req.run_dir, req.workdir, (handoff.get("sweep") or {}).get("name"))
    if req.resume:
        trained_on.check(run_dir, prepared, req.workdir)
    outputs.refuse_inputs(run_dir, {"the prepared data": prepared, "the tracking database": work.tracking_db(uri)},
                          flag="`run_dir`", folder=True)
    with interrupt.stoppable(resume_command(req, run_dir), kept=lambda: f"kept {run_dir} and its last checkpoint",
                             restart=resume_command(req, run_dir, resume=False),
                             resumable=lambda: RunFolder(run_dir).resumable()), \
            rundir.claim(run_dir, resume=req.resume, overwrite=req.overwrite) as folder:
        point = resume_point(RunFolder(folder)) if req.resume else None
        if req.resume:
            cfg = resumed_config(req, name, prepared, point, cfg)
        tracker = open_tracker(uri)
        trained_on.keep(folder, prepared, req.workdir)
        train_run = TrainRun(cfg, prepared, folder, resume=req.resume, workers=req.workers,
                             gpus_per_worker=req.gpus_per_worker, storage=work.storage(req.storage_path),
                             show_progress=req.show_progress, register=req.register)
        try:
            result = run_tracked(train_run, tracker, launcher, point=point)
        except RestoresSpent as err:
            raise RestoresSpent(f"{err}; its last checkpoint is kept: continue with "
                                f"{resume_command(req, run_dir)}") from err
    best = checkpoint.temperature(checkpoint.load(Path(result.checkpoint)))   # not the last check's, where they differ
    return replace(result, checkpoint_temperature=best, next=summary.next_commands(result, req))


def resumed_config(req: TrainRequest, name: str, prepared: Path, point: ResumePoint | None,
                   cfg: JobConfig) -> JobConfig:
    """The config that a resume trains with, from what its claimed folder's checkpoint holds
    (``point``, :func:`resume_point`): without ``model_kind`` and ``config_file``, the config of
    that checkpoint (the run's model, optimiser settings and budget) with ``sets`` on top; with
    either, ``cfg``, built from them. A folder without a checkpoint (``point`` None) keeps ``cfg``
    (claiming it says there is nothing to resume). :func:`run_tracked` then holds it to the
    checkpoint (:func:`check_resumable`).

    Raises:
        CheckpointError: its config is not readable.
    """
    from iaa.jobs.datasets import resolve

    if point is None or req.model_kind is not None or req.config_file is not None:
        return cfg
    state, source = point
    try:
        saved = from_dict(state["config"])
    except ConfigError as err:
        raise checkpoint.CheckpointError(f"cannot resume from {source}: its config is not readable ({err})") from err
    return resolve.job_config(name, prepared, sets=req.sets, base=saved)


def resume_point(folder: RunFolder) -> ResumePoint | None:
    """What a resume of ``folder``'s run is held to, read once from the checkpoint it goes on from
    (:func:`~iaa.jobs.modeling.checkpoint.load_latest`: ``last.pt``, else ``best.pt``): its config
    and vocabulary digest, with that file. The weights are not kept: the session that resumes
    loads them, and it warns where ``best.pt`` stands in for ``last.pt``. None where the folder
    holds neither file.

    Raises:
        CheckpointError: both files exist and neither loads (the message names both).
    """
    found = checkpoint.load_latest(folder.checkpoints, warn=False)
    if found is None:
        return None
    state, source = found
    return {key: state[key] for key in RESUME_KEYS if key in state}, source


def check_resumable(point: ResumePoint | None, cfg: JobConfig, prepared: Path) -> dict[str, Any]:
    """Refuse to resume from ``point`` (:func:`resume_point`) with ``cfg`` on ``prepared`` where
    its checkpoint differs in a setting outside
    :data:`~iaa.jobs.modeling.checkpoint.RESUMABLE_CHANGES` (a resume may change the budget and
    how the run computes, not what it learns), or in its vocabulary; nothing where there is no
    checkpoint. Returns the settings ``cfg`` changes (dotted key -> now)."""
    if point is None:
        return {}
    state, source = point
    return checkpoint.check_resumable(state, cfg, trained_on.TrainedOn.of(prepared).vocab_hash, str(source))


def _killed(run: Any, signal_name: str) -> None:
    """A stopped run: tagged with the signal, and KILLED (again, where its context ended it)."""
    run.set_tags({INTERRUPTED_TAG: signal_name})
    run.end("KILLED")


def resume_command(req: TrainRequest, run_dir: Path, resume: bool = True) -> Command:
    """The exact ``train ... resume`` that continues the run in ``run_dir`` (``resume=False``: that
    starts it again, for a run stopped before its first checkpoint)."""
    return Command.of("train", dataset=req.dataset, data=req.data, model_kind=req.model_kind,
                      config_file=req.config_file, sets=tuple(req.sets), run_dir=run_dir, workers=req.workers or None,
                      gpus_per_worker=f"{req.gpus_per_worker:g}" if req.gpus_per_worker else None,
                      storage_path=req.storage_path, address=req.address if req.workers else None,
                      register=req.register, **where(req.workdir, req.tracking_uri), resume=resume)


def data_of(req: TrainRequest) -> tuple[str | None, Path | None, dict[str, Any]]:
    """``--dataset``/``--data``; with neither, what the ``--config`` file names (a sweep's
    best_config.yaml names its ``data`` folder, or only its ``dataset``), else for a resume the data
    its run folder recorded (:mod:`~iaa.jobs.train.trained_on`); and the file's handoff keys."""
    from iaa.jobs.config.job_config import read_handoff, read_yaml

    handoff = read_handoff(req.config_file) if req.config_file is not None else {}
    if req.dataset is not None or req.data is not None:
        return req.dataset, req.data, handoff
    tree = read_yaml(req.config_file) if req.config_file is not None else None
    dataset = tree.get("dataset") if isinstance(tree, dict) else None
    if "data" in handoff or dataset:
        return dataset or None, Path(handoff["data"]) if "data" in handoff else None, handoff
    if req.resume and req.run_dir is not None:
        return None, trained_on.data_to_resume(req.run_dir, req.workdir), handoff
    if req.config_file is None:
        raise IaaError("give `dataset` NAME, `data` PREPARED_DIR or a `config_file` file that names its data"
                       + (", or the `run_dir` of the run to resume (it names its data)" if req.resume else ""))
    raise IaaError(f"{req.config_file}: names no data (no 'data' or 'dataset' key); give `dataset` NAME "
                   "or `data` PREPARED_DIR")


def few_checks_warning(cfg: JobConfig, prepared: Path, workers: int) -> str | None:
    """A warning where ``cfg`` on ``prepared`` makes fewer than two validation checks because its
    ``train.check_every`` is longer than the run (a large dataset's, as CNN's, on a small training
    split): the learning-rate decay and the early stop act on checks, so they never act. None
    otherwise (a run checked every half epoch makes one check only where it asks for half an epoch)."""
    from iaa.data.prepared import manifest as manifest_mod
    from iaa.data.loading.loader import num_batches

    if not cfg.train.check_every:                # every half epoch: one check is a budget of half an epoch
        return None
    found = manifest_mod.read(prepared)
    rows = found.count("train") if found is not None else 0
    n_batches = num_batches(rows, cfg.train.batch_size, max(workers, 1))
    if not n_batches or cfg.train.checks(n_batches) >= 2:
        return None
    return (f"this run makes 1 validation check, at its end: it checks every {cfg.train.check_every:,} batches "
            f"(train.check_every), and its {rows:,} training examples make {n_batches:,} batches an epoch for "
            f"{cfg.train.max_epochs:g} epoch(s); the learning-rate decay and the early stop act on checks, so they "
            f"never act. Check more often with `sets` train.check_every={max(1, n_batches // 2)} (half an epoch)")


def best_config_notice(sweep: Mapping[str, Any], cfg: JobConfig) -> str:
    """What ``train --config best_config.yaml`` is about to do, against what the sweep's trial did."""
    acc = sweep.get("best_valid_acc")
    trial = (f" ({trial_said(str(sweep.get('trial', '?')))}: valid accuracy {acc:.4f} in at most "
             f"{sweep.get('trial_max_epochs', '?')} epochs)" if isinstance(acc, (int, float)) else "")
    return (f"training the best configuration of sweep {sweep.get('name', '?')}{trial} to its early stop: "
            f"up to {cfg.train.max_epochs:g} epochs (train.max_epochs, which ends it first if it is still "
            f"improving), ending after {cfg.train.patience} checks without improvement")
