"""``iaa-cli ensemble``: gather members, evaluate them, average them, and track the result.

Members come from one of two places:

- ``--members CKPT ...``: checkpoints used as they are. The data is ``--data``/``--dataset``,
  else the dataset named in the checkpoints' configs (prepared under the workdir).
- ``--sweep NAME``: ``WORKDIR/sweeps/NAME/sweep.json`` (a default name such as ``demo-iaa``
  means the latest ``demo-iaa-<id>``). :mod:`iaa.jobs.ensemble.members` picks its K best configurations
  x N seeds and the checkpoints to reuse; :mod:`iaa.jobs.ensemble.sweep_training` trains the rest in
  parallel as trials of the :class:`~iaa.jobs.ports.Launcher` (``train_many``).

Every member is evaluated on valid and test with the evaluate job; :mod:`iaa.jobs.evaluation.ensembling.averaging`
does the alignment, averaging and selection, and fits the temperature that calibrates the
ensemble's probabilities on valid (``calibrate``), which its model answers with. Everything
lands in ``WORKDIR/ensembles/NAME/``, and one MLflow run, open for the whole job, records it
(:mod:`iaa.jobs.ensemble.ensemble_run`; the members it trains nest under it, and it under the
sweep's parent run).
``ensemble.json`` names every member with the sha256 of the file taken when the ensemble first
read it (``member_sha256``); paths inside the work folder are stored relative to it
(:mod:`iaa.jobs.evaluation.ensembling.ensemble_record`), so the folder means the same wherever it is used or
moved, and a changed member is refused (``iaa.jobs.evaluation.ensembling.ensemble_record.members``). A
member whose file changes before the end (retrained meanwhile) is refused too, before
``ensemble.json`` is written and again after the model is logged. A finished ensemble is
replaced only with ``overwrite``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from iaa import logs
from iaa.data.datasets import TRAINING_SPLITS
from iaa.data.prepared.shards import file_sha256
from iaa.errors import IaaError
from iaa.jobs import interrupt
from iaa.jobs.ensemble import configurations, ensemble_run, scoring, sweep_training
from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
from iaa.jobs.ensemble.ensemble_result import EnsembleResult, describe, of_record
from iaa.jobs.evaluation.ensembling import averaging, ensemble_record
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.ensemble import members as ledger
from iaa.jobs.workdir import lock
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.config.job_config import ConfigError, from_dict
from iaa.jobs.ensemble.members import Member
from iaa.jobs.ports import INTERRUPTED_TAG, Launcher, TrackedRun, Tracker
from iaa.jobs.evaluation.predictor import SUMMARY
from iaa.jobs.workdir.paths import Workdir

_log = logging.getLogger(__name__)
VOCABULARY_TODO = ("an ensemble's members and the data must share one vocabulary; pass the prepared folder they "
                   "were trained on with `data`")


def _run_dir_label(checkpoint: Path) -> str:
    """A given member's label: its run folder (``RUN/checkpoints/best.pt``), its sweep and trial (a
    Ray Tune checkpoint, ``ray/SWEEP/TRIAL/checkpoint_000001/checkpoint.pt``), else the file's name."""
    folder = checkpoint.parent
    if folder.name == "checkpoints":
        return folder.parent.name
    if folder.name.startswith("checkpoint_"):
        return f"{folder.parent.parent.name}/{folder.parent.name}"
    return checkpoint.stem


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
    from iaa.data.loading.loader import PreparedData

    data = PreparedData.open(Path(prepared))
    return split in data.splits and data.table(split).num_rows > 0


def evaluate_members(members: Sequence[Member], prepared: Path, out_dir: Path, show_progress: bool) -> list[dict[str, Path | None]]:
    """Each member's predictions files on valid and (where the data has it) test."""
    from iaa.jobs.evaluation import evaluate

    splits = ["valid"] + (["test"] if _has_split(prepared, "test") else [])
    sizes = scoring.split_sizes(prepared)
    files: list[dict[str, Path | None]] = []
    bar = logs.progress("evaluate members", "q", total=len(members) * sum(sizes[s] for s in splits),
                        shown=show_progress)
    for i, member in enumerate(members):
        entry: dict[str, Path | None] = {"valid": None, "test": None}
        for split in splits:
            out = out_dir / "members" / f"{i:02d}-{split}.parquet"
            bar.set_postfix_str(f"member {i + 1}/{len(members)} {split}", refresh=sys.stderr.isatty())
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
        :class:`iaa.jobs.interrupt.Interrupted` (its runs KILLED; of a sweep's ensemble, the
        members trained so far are kept, and its line says so; given members train nothing to keep).
    """
    kept = (lambda: sweep_training.KEPT) if req.sweep is not None else (lambda: "")
    with interrupt.stoppable(resume_command(req), kept=kept), contextlib.ExitStack() as held:
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
    check_vocabulary([(path, _vocab_hash(path)) for path in sweep_training.reused_checkpoints(req, sweep)], prepared)
    sweep_training.check_cluster(req, sweep, prepared, launcher)
    return Settled(sweep, (), dataset, prepared, name, out_dir, sweep.experiment or f"ensemble-{dataset}",
                   scoring.baselines(prepared))


def _vocab_hash(path: Path) -> str:
    """The vocabulary a checkpoint was trained on (its hash; "" for an older checkpoint)."""
    from iaa.jobs.modeling import checkpoint

    return str(checkpoint.load(path).get("vocab_hash", ""))


def check_vocabulary(members: Sequence[tuple[Path, str]], prepared: Path) -> None:
    """Refuse a member (a checkpoint and its vocabulary's hash) trained on another vocabulary
    than the prepared data's: its word ids would mean other words there."""
    from iaa.data.loading.loader import PreparedData
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
    # as the ensemble nests under its sweep's run; a stopped one is continued.
    parent = sweep.parent_run_id if sweep is not None else None
    tags = ensemble_run.run_tags(dataset, req.select, out_dir, sweep)
    with tracker.run(experiment, f"ensemble-{name}", tags=tags, parent_run_id=parent,
                     resume_id=ensemble_run.stopped_run(tracker, experiment, tags)) as run:
        interrupt.on_stop(lambda signal_name: _end_run(run, signal_name))   # a second signal skips the block's end
        members = (sweep_training.sweep_members(req, sweep, prepared, out_dir, tracker, name, launcher,
                                                run_id=run.run_id)
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
        summary = {**result.fields(), "name": name, "dataset": dataset, "data_dir": str(Path(prepared).resolve()),
                   "ensemble_dir": str(out_dir.resolve()), "member_labels": labels, "member_run_ids": [m.mlflow_run_id for m in members],
                   "sweep": req.sweep, "tracking_uri": uri, "mlflow_run_id": run.run_id,
                   "member_sha256": {str(m.checkpoint): m.sha256 for m in members}, "calibrate": req.calibrate}
        summary.update({**scoring.accuracy_keys(summary, sizes), **settled.baselines,
                        **{key: str(Path(summary[key]).resolve()) for key in ("predictions", "table_path")}})
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
