"""``iaa-cli distill``: train one reader against an ensemble's averaged distributions.

1. The teacher: the ensemble folder's selected members (``ensemble.json``), each with its
   checkpoint digest. Their averaged distribution on the training split is computed once
   (:mod:`iaa.jobs.distill.teacher`; in parallel through the given ``Scorer``, e.g. on Ray) and kept in
   ``WORKDIR/distill/teachers/ENSEMBLE.parquet`` (never beside the prepared data, which may be
   shared or read-only); a later distillation from the same ensemble reuses
   it after checking that no member's checkpoint (and not the data) changed since.
2. The student: the first member's config (so, by default, a member's size), then ``--config``,
   ``--model`` and ``--set`` as for ``train``; ``alpha`` and ``temperature`` where given, else
   the ``distill.alpha`` / ``distill.temperature`` the file or ``--set`` give, else 0.5 and 1.
   It trains with the train workflow on the training rows that carry a teacher distribution,
   with the loss α · NLL + (1 - α) · T² · KL(teacher ‖ student) (:mod:`iaa.jobs.modeling.objective`),
   validates on the gold answers, and ends as a checkpoint and an MLflow model like any reader.
   The teacher file is logged as an input of the run (context ``teacher``).
3. The comparison: the student against the ensemble and its best member
   (:func:`iaa.jobs.distill.outcome.comparison`), in the result and, given the tracker, as metrics
   of the student's run and in its description (:func:`record`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from iaa.data.datasets import TRAINING_SPLITS
from iaa.errors import IaaError, printable
from iaa.files import writing
from iaa.jobs.distill import identity, teacher as teacher_mod
from iaa.jobs.config.job_config import JobConfig, from_dict, load
from iaa.jobs.distill.outcome import COMPARED, DistillResult, run_note
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.evaluation.ensembling.ensemble_record import EnsembleRecord
from iaa.jobs.ports import Tracker, TrainRun, TrainWorkflow
from iaa.jobs.training.summary import TrainResult
from iaa.jobs.workdir import recorded
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, RunFolder, Workdir

_log = logging.getLogger(__name__)

ALPHA = 0.5          # the gold NLL's weight where neither the command nor the config gives one


@dataclass(frozen=True)
class DistillRequest:
    ensemble: Path
    data: Path | None = None            # default: the ensemble's data
    model_kind: str | None = None
    config_file: Path | None = None
    sets: tuple[str, ...] = ()
    alpha: float | None = None          # weight of the gold NLL; None: the config's distill.alpha, else ALPHA
    temperature: float | None = None    # None: the config's distill.temperature, else 1
    train_examples: int | None = None   # distil on the first N training examples only
    run_dir: Path | None = None
    workdir: Path = Path(DEFAULT_WORKDIR)
    tracking_uri: str | None = None     # named in the resume line; the store itself is the caller's tracker
    register: str | None = None         # also register the student's MLflow model under this name
    teacher_workers: int = 0            # Ray tasks that score the teacher's members; 0: the caller's scorer decides
    address: str | None = None          # the Ray cluster the teacher is scored on; None: a local one
    refresh_teacher: bool = False
    show_progress: bool = True
    resume: bool = False                # continue the run in run_dir: refused when its teacher differs


def student_config(member_checkpoint: Path, prepared: Path, req: DistillRequest) -> JobConfig:
    """A member's config, then ``--config``, ``--model``, ``--set`` and the distillation flags."""
    from iaa.jobs.modeling import checkpoint
    from iaa.jobs.datasets import resolve

    cfg = load(from_dict(checkpoint.load(member_checkpoint)["config"]), req.config_file)
    if req.model_kind is not None:
        cfg = replace(cfg, model=replace(cfg.model, kind=req.model_kind))
    cfg = load(cfg, None, req.sets)
    chosen = resolve.chosen_keys(req.config_file, req.sets)
    alpha = req.alpha if req.alpha is not None else cfg.distill.alpha if "distill.alpha" in chosen else ALPHA
    temperature = (req.temperature if req.temperature is not None
                   else cfg.distill.temperature if "distill.temperature" in chosen else 1.0)
    cfg = replace(cfg, distill=replace(cfg.distill, alpha=alpha, temperature=temperature))
    return replace(cfg, model=replace(cfg.model, vocab_size=resolve.vocab_size(prepared)))


def teacher_path(workdir: Path, ensemble_dir: Path, limit: int | None) -> Path:
    """``WORKDIR/distill/teachers/<ensemble folder name>[-first<N>]-<hash>.parquet``: in the work
    folder, never beside the prepared data; the hash is of the ensemble's path within the work
    folder (so a moved folder finds its teachers), or of its absolute path."""
    where = recorded.stored(Path(ensemble_dir), Path(workdir))
    tag = hashlib.sha1(str(where).encode()).hexdigest()[:8]
    part = f"-first{limit}" if limit is not None else ""
    return Workdir(workdir).teachers / f"{Path(ensemble_dir).name}{part}-{tag}.parquet"


def prepare_teacher(req: DistillRequest, prepared: Path, members: Sequence[teacher_mod.Member],
                    score: teacher_mod.Scorer) -> tuple[Path, bool]:
    """The teacher file for ``req``: reused when fresh, else computed. Returns (path, computed)."""
    from iaa.data.loading.loader import PreparedData

    vocab_hash = PreparedData.open(prepared).manifest.vocab_hash
    path = teacher_path(req.workdir, req.ensemble, req.train_examples)
    if path.exists() and not req.refresh_teacher:
        teacher_mod.check_fresh(path, members, vocab_hash, req.train_examples)
        return path, False
    if req.show_progress:
        _log.info(f"distill: computing the teacher of {len(members)} member{'' if len(members) == 1 else 's'} on "
                  f"{req.train_examples or 'all'} training examples -> {path}")
    work = Path(req.workdir) / "distill" / f"scoring-{path.stem}"     # scratch, outside the prepared data
    with writing(path):                 # a full disk here names the teacher, not the run folder
        table = teacher_mod.compute(members, prepared, "train", req.train_examples, work, score)
        teacher_mod.write(table, path, ensemble_dir=req.ensemble, members=members, split="train",
                          limit=req.train_examples, vocab_hash=vocab_hash)
    for scratch in work.glob("*.parquet"):
        scratch.unlink()
    work.rmdir()
    return path, True


def run(req: DistillRequest, *, train: TrainWorkflow[TrainResult],
        score: teacher_mod.Scorer = teacher_mod.score_in_process, claim: Callable[[Path], Any] | None = None,
        tracker: Tracker | None = None) -> DistillResult:
    """Distil the ensemble ``req.ensemble`` into one reader; see the module docstring.

    ``train`` trains the student: it is handed one :class:`~iaa.jobs.ports.TrainRun` (the run
    folder, the rows with their teacher distributions, ``req.resume``, ``req.register`` ...; the
    command line's is ``iaa-cli train``'s tracked workflow). ``claim`` holds the run folder for
    the run (default: :func:`iaa.jobs.workdir.rundir.claim`, which refuses a folder that holds a
    run; with ``req.resume``, a run learnt from another teacher is refused,
    :mod:`iaa.jobs.distill.identity`). ``tracker``: the store ``train`` tracks the student's
    run in, where the comparison is recorded on that run (:func:`record`). Returns the train
    workflow's result (``checkpoint``, ``best_valid_acc``, ``model_uri``, ...) with the teacher, the
    members, the comparison with them and the next commands
    (:class:`~iaa.jobs.distill.outcome.DistillResult`). SIGINT or SIGTERM raises
    :class:`iaa.jobs.interrupt.Interrupted` (the student's run KILLED).
    """
    from iaa.jobs import interrupt

    with interrupt.stoppable(resume_command(req), kept=lambda: "kept the teacher file and the student's last checkpoint"):
        result = _run(req, train=train, score=score, claim=claim)
    return result if tracker is None else record(tracker, result)


def record(tracker: Tracker, result: DistillResult) -> DistillResult:
    """Record the student's comparison with its teacher on its tracked run (``result.mlflow_run_id``):
    the figures of :func:`~iaa.jobs.distill.outcome.comparison` (``teacher_valid_acc``,
    ``best_member_valid_acc``, ``gain_points``, ``gain_kept_points``; those that are known) as
    metrics at the run's last step, beside the student's ``final_best_valid_acc``, and the run's
    description with them (:func:`~iaa.jobs.distill.outcome.run_note`). A result without a run is
    returned as it is; what the store does not keep is a warning of the result: the student stands.
    """
    if not result.mlflow_run_id:
        return result
    figures = {key: getattr(result, key) for key in COMPARED if getattr(result, key) is not None}
    try:
        tracked = tracker.attach(result.mlflow_run_id)
        before = len(tracked.lost)
        tracked.log_metrics(figures, step=int(result.steps))
        tracked.set_tags({"mlflow.note.content": run_note(result)})
        lost = tracked.lost[before:]
    except (IaaError, *tracker.transient_errors) as err:
        lost = [printable(str(err))]
    if not lost:
        return result
    return replace(result, warnings=(*result.warnings, f"run {result.mlflow_run_id} of {tracker.uri} did not keep "
                                                      f"the comparison with the teacher: {'; '.join(lost)}"))


def resume_command(req: DistillRequest, resume: bool = True) -> Command:
    """The exact ``distill ... resume`` that continues the student's run (``resume=False``: that
    starts it again, for a student stopped before its first checkpoint)."""
    return Command.of("distill", ensemble_dir=req.ensemble, model_kind=req.model_kind,
                      config_file=req.config_file, sets=tuple(req.sets),
                      alpha=None if req.alpha is None else f"{req.alpha:g}",
                      temperature=None if req.temperature is None else f"{req.temperature:g}",
                      train_examples=req.train_examples, run_dir=req.run_dir, register=req.register,
                      workers=req.teacher_workers or None, address=req.address,
                      **where(req.workdir, req.tracking_uri), resume=resume)


def _run(req: DistillRequest, *, train: TrainWorkflow[TrainResult], score: teacher_mod.Scorer,
         claim: Callable[[Path], Any] | None) -> DistillResult:
    from iaa.data.loading.loader import PreparedData
    from iaa.jobs.datasets import resolve

    if req.train_examples is not None and req.train_examples < 1:
        raise IaaError("`train_examples` must be >= 1")
    ensemble, members = teacher_mod.members_of(req.ensemble)
    dataset, prepared = resolve.data_dir(None, Path(req.data or ensemble.data_dir or ""), req.workdir,
                                         splits=TRAINING_SPLITS)
    cfg = student_config(members[0].checkpoint, prepared, req)
    run_dir = req.run_dir or Workdir(req.workdir).run(
        f"distill-{Path(req.ensemble).name}-{cfg.model.kind}-seed{cfg.train.seed}").path
    teacher = identity.of(ensemble.name, req.ensemble, [m.digest for m in members])
    from iaa.jobs import interrupt
    from iaa.jobs.workdir import rundir

    interrupt.resumes_when(lambda: RunFolder(Path(run_dir)).resumable(), resume_command(req, resume=False))

    # the run folder is claimed first: one in use, or holding a run, is refused before the teacher is scored
    with (claim or rundir.claim)(Path(run_dir)) as folder:
        identity.keep(Path(folder), teacher, req.resume)
        path, computed = prepare_teacher(req, prepared, members, score)
        data = PreparedData.open(prepared)
        rows = data.table("train") if req.train_examples is None else data.rows("train", 0, req.train_examples)
        rows = teacher_mod.attach(rows, path)
        tags = {"teacher": str(Path(path).resolve()), "teacher_ensemble": str(Path(req.ensemble).resolve()), "distill.members": str(len(members)),
                "teacher_id": identity.tag(teacher)}
        result = train(TrainRun(cfg, prepared, Path(folder), resume=req.resume, show_progress=req.show_progress,
                                register=req.register, train_rows=rows, teacher=path, tags=tags,
                                experiment=experiment_name(ensemble, req.ensemble)))
    from iaa.jobs.distill.outcome import comparison
    from iaa.jobs.training.summary import next_commands, with_baseline

    result = with_baseline(result, prepared)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return DistillResult(**fields | {"next": next_commands(result, req)},
                         teacher=str(Path(path).resolve()), teacher_computed=computed, dataset=dataset,
                         members=tuple(str(m.checkpoint) for m in members),
                         **comparison(result.best_valid_acc, ensemble))


def experiment_name(ensemble: EnsembleRecord, ensemble_dir: Path) -> str:
    """The student's MLflow experiment, named for its ensemble: ``distill-ENSEMBLE``."""
    return f"distill-{ensemble.name or Path(ensemble_dir).name}"
