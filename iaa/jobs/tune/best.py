"""After the sweep: the best trial's config, every trial's logged model, the best one's explain
page, the parent run's metrics and the summary on stderr.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.errors import IaaError, printable
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.cost import duration
from iaa.jobs.config.job_config import TrainConfig, config_label, dump_yaml
from iaa.jobs.evaluation import frequency, model_card, uncertainty
from iaa.jobs.evaluation.closing import next_block
from iaa.jobs.evaluation.frequency import BaselineResult
from iaa.jobs.evaluation.result import Keyed, Result, absent_when_none
from iaa.jobs.config import exploration, search_space
from iaa.jobs.ports import ModelCard, ModelFiles, TrackedRun, Tracker, TrialRecord, trial_said
from iaa.jobs.sweeps.ranking import Ranking
from iaa.jobs.sweeps.record import FINISHED_STATUSES, SweepRecord

from iaa.jobs.tune import try_first, warm_start
from iaa.jobs.tune.next_steps import next_steps
from iaa.jobs.tune.parent_run import run_columns
from iaa.jobs.tune.request import SweepInterrupted
from iaa.jobs.tune.settle import SweepPlan
from iaa.jobs.workdir.paths import BEST_CONFIG, SWEEP_RECORD

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TuneResult(Keyed, Result):
    """``iaa-cli tune``: the sweep, its best trial and where its outputs are.

    ``model_uri`` is the best trial's logged model (None when it has no run, or the store refused
    it); ``explain_page`` and ``explain_png`` are absent when no page was made;
    ``nothing_left`` is True for a resumed sweep that had nothing left to run; ``lost_trials``
    names the trials that lost their worker with no restores left, which resuming runs again;
    ``cut_trials`` those that the sweep's time budget stopped where they stood; ``warm_start``,
    ``carried_trials`` and ``carried_best_valid_acc`` are absent unless the sweep began with an
    earlier sweep's trials (their best is not this sweep's: ``best_*`` are its own trials');
    ``tried_first`` (how many configurations the sweep was given to try first) and
    ``best_tried_first`` (which of them, from 1, the best trial holds) are absent unless given.
    ``close_trials`` are the trials below the best by less than chance moves two scores on the
    validation set (closest first; ties are in ``tied_trials``): the sweep cannot rank them.
    ``best_trial`` is the best trial's Tune id (its folder under the sweep's storage, the sweep
    run's param ``best.ray_trial_id`` and tag ``best_ray_trial_id``); ``best_trial_label`` is its
    one name (``trial-0003``), as the console, ``tied_trials``, ``close_trials``, ``report
    --sweeps`` and the sweep run's param ``best.trial_id`` and tag ``best_trial_id`` name it.
    """

    sweep: str
    tracking_uri: str | None
    experiment: str | None
    best_config: Path
    best_valid_acc: float | None
    baseline_valid_acc: float
    best_trial: str
    best_trial_label: str
    best_checkpoint: str | None
    trials: int
    sweep_json: Path
    parent_run_id: str | None
    best_mlflow_run_id: str | None = None
    explain_page: str | None = absent_when_none()
    explain_png: str | None = absent_when_none()
    model_uri: str | None = None
    mlflow_ui: str
    best_valid_acc_n: int
    best_valid_acc_stderr: float | None
    tied_trials: tuple[str, ...] = ()
    close_trials: tuple[str, ...] = ()
    lost_trials: tuple[str, ...] = ()
    cut_trials: tuple[str, ...] = ()
    nothing_left: bool | None = absent_when_none()
    warm_start: str | None = absent_when_none()
    carried_trials: int | None = absent_when_none()
    carried_best_valid_acc: float | None = absent_when_none()
    tried_first: int | None = absent_when_none()
    best_tried_first: int | None = absent_when_none()


def _result(plan: SweepPlan, sweep: SweepRecord, best: TrialRecord, ranking: Ranking, baseline: BaselineResult,
            ui: str, outputs: Mapping[str, str | None], **more: Any) -> TuneResult:
    accuracy = uncertainty.fields("best_valid_acc", best.best_valid_acc, baseline.examples)
    carried = sweep.warm_start
    if carried is not None:
        more = {"warm_start": carried.sweep, "carried_trials": carried.trials,
                "carried_best_valid_acc": carried.best, **more}
    if plan.try_first:
        more = {"tried_first": len(plan.try_first), "best_tried_first": try_first.held_by(plan.try_first, best.params),
                **more}
    return TuneResult(sweep=sweep.name, tracking_uri=sweep.tracking_uri, experiment=sweep.experiment,
                      best_config=(plan.folder / BEST_CONFIG).resolve(), best_valid_acc=best.best_valid_acc,
                      baseline_valid_acc=baseline.accuracy, best_trial=best.trial_id, best_trial_label=best.label,
                      best_checkpoint=best.checkpoint, trials=len(sweep.trials), sweep_json=plan.record_file.resolve(),
                      parent_run_id=sweep.parent_run_id, best_mlflow_run_id=best.mlflow_run_id,
                      explain_page=outputs.get("explain_page"),
                      explain_png=outputs.get("explain_png"), model_uri=outputs.get("model_uri"), mlflow_ui=ui,
                      best_valid_acc_n=int(accuracy["best_valid_acc_n"] or 0),
                      best_valid_acc_stderr=accuracy["best_valid_acc_stderr"], tied_trials=ranking.ties,
                      close_trials=ranking.close,
                      lost_trials=tuple(r.label for r in sweep.trials if r.lost),
                      cut_trials=tuple(r.label for r in sweep.trials if r.cut),
                      next=next_steps(plan, best, plan.folder / BEST_CONFIG, ranking.top_configs), **more)


def finish(plan: SweepPlan, sweep: SweepRecord, parent: TrackedRun, tracker: Tracker) -> TuneResult:
    """The best trial of ``sweep`` (what ``plan`` ran): its config as YAML, the table, the parent
    run's metrics and artifacts, and on the best trial's run its MLflow model and explain page."""
    name, records, space, sweep_dir, prepared = sweep.name, list(sweep.trials), plan.space, plan.folder, plan.prepared
    scored = _scored_trials(plan, sweep, parent)
    best = max(scored, key=lambda r: r.best_valid_acc or 0.0)
    best_config = sweep_dir / BEST_CONFIG
    write_best_config(best, best_config, name, plan.train_epochs, plan.data, plan.base.train.precision)
    _log.info(sweep_file.table(records, list(space.params)))
    for note in exploration.notes([r.params for r in scored], list(space.params)):
        _log.warning(printable(note))
    lost = [r for r in records if r.lost]
    if lost:
        unchecked = " (from the start where they made none)" if any(not r.checks for r in lost) else ""
        again = ("the time budget is spent, so they stay so" if sweep.budget_spent
                 else f"{plan.resume_command} runs them again from their last check{unchecked}")
        names = ", ".join(r.label + ("" if r.checks else ": no check") for r in lost)
        _log.warning(printable(f"{len(lost)} trial(s) lost a worker with no restores left and ended where they "
                               f"stood ({names}); {again}"))
    if sweep.budget_spent:
        _log.info(printable(budget_line(sweep)))
    if sweep.warm_start is not None and (sweep.warm_start.best or 0.0) > (best.best_valid_acc or 0.0):
        _log.warning(printable(warm_start.ahead_line(sweep.warm_start, best)))
    given = try_first.held_by(plan.try_first, best.params)
    if given is not None:
        _log.info(printable(f"the best {trial_said(best.label)} holds configuration {given} of the "
                            f"{len(plan.try_first)} given to try first"))
    baseline = frequency.run(prepared, "valid")
    scores = {r.label: r.best_valid_acc for r in scored}
    ranking = Ranking.of(scores, baseline.examples)
    label, view = _record_on_parent(parent, tracker, best, records, sweep, space, best_config, sweep_dir, ranking,
                                    baseline)
    card = _card(sweep, best, label, baseline)
    outputs, unlogged = best_outputs(best, tracker, sweep_dir, prepared, plan.register, records, card)
    outputs = {key: str(Path(value).resolve()) if key in ("explain_page", "explain_png") and value else value
               for key, value in outputs.items()}              # said as the next commands are: absolute
    for key in ("explain_page", "explain_png"):          # the sweep's run shows its best trial's page too
        if outputs.get(key):
            tracker.attach(parent.run_id).log_artifact(Path(outputs[key]), "explain")
    if parent.lost:
        unlogged.insert(0, f"the sweep's run {parent.run_id} (marked FAILED) lacks {', '.join(parent.lost)}")
    ui = tracker.ui_command
    base, n_valid = baseline.accuracy, baseline.examples
    _say_ranking(plan, best, ranking, scores, baseline)
    _log.info(printable(f"best {trial_said(best.label)} ({label}): valid accuracy "
                        f"{frequency.beside(best.best_valid_acc, base, n_valid)}\n"
                        f"  config:       {best_config.resolve()}\n"
                        + (f"  explain page: {outputs['explain_page']}\n" if outputs.get("explain_page") else "")
                        + (f"  its figure:   {outputs['explain_png']}\n" if outputs.get("explain_png") else "")
                        + f"  runs:         {runs_line(ui, view)}\n"
                        + next_block(next_steps(plan, best, best_config, ranking.top_configs)), keep_lines=True))
    if unlogged:
        raise IaaError(f"{sweep.tracking_uri}: the sweep finished and its files are written, but the store did "
                       f"not record everything; {'; '.join(unlogged)}. Free the store's disk (or unlock it, or "
                       "restart it) and log the models again")
    return _result(plan, sweep, best, ranking, baseline, ui, outputs)


def runs_line(ui: str, view: str | None) -> str:
    """Where to see the sweep's runs: the UI's command and then its view of the sweep; a tracking
    server, which is its own UI, by the view alone."""
    if not view:
        return ui
    return f"open {view}" if ui.startswith("open ") else f"{ui}  (then open {view})"


def _say_ranking(plan: SweepPlan, best: TrialRecord, ranking: Ranking, scores: Mapping[str, float | None],
                 baseline: BaselineResult) -> None:
    """How far the validation set ranks the sweep's best trial, said: a warning where it is below
    the baseline or tied, a note naming the trials it cannot tell from it and the ensemble that can."""
    n_valid = baseline.examples
    warnings = frequency.below_warning(best.best_valid_acc, baseline.accuracy, f"the best {trial_said(best.label)}")
    if len(ranking.ties) > 1:
        warnings.append(uncertainty.tie_note(ranking.ties, best.label, best.best_valid_acc, n_valid))
    for warning in warnings:
        _log.warning(printable(warning))
    if ranking.close:
        ensemble = plan.command("ensemble", sweep=plan.name, top_configs=ranking.top_configs)
        _log.info(printable(ranking.note(scores, best.label, n_valid, ensemble)))


def budget_line(sweep: SweepRecord) -> str:
    """How the time budget ended ``sweep``: the trials it had begun, and those it stopped."""
    cut = [r for r in sweep.trials if r.cut]
    unchecked = sum(1 for r in cut if not r.checks)
    return (f"sweep {sweep.name}: its time budget of {duration(sweep.time_budget_s or 0)} ended it with "
            f"{len(sweep.trials)} of {sweep.num_samples} trials begun; {len(cut)} stopped where "
            f"{'it' if len(cut) == 1 else 'they'} stood ({', '.join(r.label for r in cut)}) and "
            f"{'its' if len(cut) == 1 else 'their'} checks count"
            + (f"; {unchecked} of them had made no check" if unchecked else ""))


def finished_result(plan: SweepPlan, tracker: Tracker) -> TuneResult:
    """The result of a resumed sweep that has nothing left to run, read from its record
    (``sweep.json``, the best trial's files), its data and the best trial's logged model, with
    ``nothing_left``.

    Nothing is written, logged or started (the sweep's folder stays as it is), unless the best
    trial's explain page or logged model is missing, which a failure after the trials leaves
    (a full store, a crash): those are made now (:func:`remade_outputs`).
    """
    assert plan.recorded is not None
    sweep, sweep_dir = plan.recorded, plan.folder
    scored = [r for r in sweep.trials if r.scored]
    if not scored:
        raise IaaError(f"sweep {sweep.name} has nothing left to run, but no trial of it finished a validation "
                       f"check ({plan.record_file}); run a new sweep under another `sweep_name`")
    best = max(scored, key=lambda r: r.best_valid_acc or 0.0)
    outputs = {key: str((sweep_dir / f"explain-best.{ext}").resolve()) for key, ext in (("explain_page", "html"),
                                                                          ("explain_png", "png"))
               if (sweep_dir / f"explain-best.{ext}").is_file()}
    if best.mlflow_run_id:
        outputs["model_uri"] = tracker.model_uri(best.mlflow_run_id)
    baseline = frequency.run(plan.prepared, "valid")
    outputs.update(remade_outputs(plan, sweep, best, tracker, outputs, baseline))
    ranking = Ranking.of({r.label: r.best_valid_acc for r in scored}, baseline.examples)
    return _result(plan, sweep, best, ranking, baseline, tracker.ui_command, outputs, nothing_left=True)


def remade_outputs(plan: SweepPlan, sweep: SweepRecord, best: TrialRecord, tracker: Tracker,
                   outputs: Mapping[str, Any], baseline: BaselineResult) -> dict[str, Any]:
    """The best trial's explain page (``explain_page``, ``explain_png``) and logged model
    (``model_uri``) that ``outputs`` lacks, made now where its checkpoint is kept, and said;
    nothing where none is missing. The sweep's first end makes them; a failure after its trials
    (a full store, a crash) can leave them unmade.

    Raises:
        IaaError: the store did not take the model; the best trial's run is marked FAILED.
    """
    from iaa.jobs.evaluation.predictor import MODEL_CODE

    if not best.checkpoint or not Path(best.checkpoint).is_file():
        return {}
    made: dict[str, Any] = {}
    run = tracker.attach(best.mlflow_run_id) if best.mlflow_run_id else None
    if not outputs.get("explain_page"):
        page = _explain_best(best, plan.folder, plan.prepared)
        made.update(explain_page=str(Path(page.html).resolve()), explain_png=str(Path(page.png).resolve()))
        for artifact in (page.html, page.png):
            if run is not None:
                run.log_artifact(Path(artifact), "explain")
    if run is not None and outputs.get("model_uri") is None:
        made["model_uri"] = tracker.log_model(run, ModelFiles.of(best.checkpoint, plan.prepared), plan.register,
                                              code=MODEL_CODE, card=_card(sweep, best, config_label(best.params),
                                                                          baseline))
    if made:
        what = " and ".join(w for key, w in (("explain_page", "explain page"), ("model_uri", "logged model"))
                            if key in made)
        _log.info(printable(f"sweep {sweep.name}: the {what} of its best {trial_said(best.label)} had not been made "
                            f"when it ended; made now"))
    if run is not None and run.lost:
        run.end("FAILED")
        raise IaaError(f"{sweep.tracking_uri}: the store did not record everything of run {run.run_id} (marked "
                       f"FAILED): it lacks {', '.join(run.lost)}. Free the store's disk (or unlock it, or restart it) "
                       f"and run {plan.resume_command} again")
    return made


def _explain_best(best: TrialRecord, sweep_dir: Path, prepared: Path) -> Any:
    """The best trial's explain page and figure in the sweep's folder (its first validation examples)."""
    from iaa.jobs.evaluation.explaining import explain

    assert best.checkpoint is not None
    return explain.run(Path(best.checkpoint), prepared, "valid", first=EXPLAIN_EXAMPLES,
                       out=sweep_dir / "explain-best.html", png=sweep_dir / "explain-best.png",
                       source=f"sweep {sweep_dir.name}, {trial_said(best.label)}")


def _scored_trials(plan: SweepPlan, sweep: SweepRecord, parent: TrackedRun) -> list[TrialRecord]:
    """The trials of ``sweep`` that finished a validation check; with an unfinished trial (the
    sweep was interrupted) or none scored, the parent run is ended KILLED or FAILED and this raises
    (an expected error, naming the resume, where trials lost their workers or the time budget
    stopped every trial before its first check)."""
    records, name, resume = sweep.trials, sweep.name, plan.resume_command
    unfinished = [r for r in records if r.status not in FINISHED_STATUSES]
    if unfinished:
        parent.end("KILLED")
        raise SweepInterrupted(f"sweep {name} interrupted with {len(unfinished)} unfinished trial(s); "
                               f"continue it with: {resume}")
    scored = [r for r in records if r.scored]
    if scored:
        return scored
    lost = [r.label for r in records if r.lost]
    if lost:
        parent.end("KILLED")
        raise SweepInterrupted(f"sweep {name}: no trial finished; {len(lost)} trial(s) lost a worker with no restores "
                               f"left ({', '.join(lost)}); continue it with: {resume}")
    parent.end("FAILED")
    if sweep.budget_spent:
        raise IaaError(f"{budget_line(sweep)}: the sweep has no result; a trial's first check comes after "
                       f"{_check_interval(plan.base.train)}: give a `time_budget_s` that lets a trial reach it, or check "
                       "more often (`sets` train.check_every=BATCHES)")
    errors = "; ".join(f"{r.label}: {r.error}" for r in records if r.error)[:2000]
    raise RuntimeError(f"sweep {name}: no trial finished a validation check. {errors}")


def _check_interval(train: TrainConfig) -> str:
    """How often a trial of ``train`` checks, in words."""
    if not train.check_every:
        return "half an epoch of training"
    return f"{train.check_every:,} batches of {train.batch_size} ({train.check_every * train.batch_size:,} examples)"


def _record_on_parent(parent: TrackedRun, tracker: Tracker, best: TrialRecord, records: list[TrialRecord],
                      sweep: SweepRecord, space: search_space.SearchSpace, best_config: Path,
                      sweep_dir: Path, ranking: Ranking, baseline: BaselineResult) -> tuple[str, str | None]:
    """The sweep's metrics (``best_valid_acc`` with its standard error and the baseline beside it,
    ``baseline_valid_acc``), the best trial's params, tags and note, its config and ``sweep.json``
    on the parent run, which is then ended; the best trial's run is tagged ``best_in_sweep``, and
    the parent ``close_trials`` with those the validation set cannot tell from it. While a trial
    lost its worker (a resume runs it again and may find a better one) the best is in the tags
    only: the params wait for the sweep's last run. The best trial is named by its one name
    (``best.trial_id``, ``best_trial_id``: ``trial-0003``) and by Tune's id of it
    (``best.ray_trial_id``, ``best_ray_trial_id``); the size of the valid split is the param
    ``best_valid_acc_n``.

    Returns the best config's label and the store's view of the runs with the search's columns."""
    n_valid = baseline.examples
    accuracy = uncertainty.fields("best_valid_acc", best.best_valid_acc, n_valid)
    parent.log_metrics({"best_valid_acc": best.best_valid_acc, "trials": len(records),
                        "trials_stopped_early": sum(r.stop_reason == "asha" for r in records),
                        "trials_failed": sum(r.status == "ERROR" for r in records),
                        "trials_lost": sum(r.lost for r in records),
                        "trials_cut": sum(r.cut for r in records),
                        "baseline_valid_acc": baseline.accuracy,
                        **({"best_valid_acc_stderr": accuracy["best_valid_acc_stderr"]}
                           if accuracy["best_valid_acc_stderr"] is not None else {})}, step=0)
    parent.log_params({"best_valid_acc_n": n_valid})        # the data of every resume is the same
    label = config_label(best.params)
    if sweep.budget_spent or not any(r.lost for r in records):   # params never change: not while a resume may
                                                                    # find a better trial
        parent.log_params({**{f"best.{k}": v for k, v in best.params.items()}, "best.trial_id": best.label,
                           "best.ray_trial_id": best.trial_id})
    view = tracker.show_columns(sweep.experiment or "", run_columns(space))
    # relative to the page showing the note, so it holds for any host and port the UI is served on
    link = f"(#{view.split('#', 1)[1].split('/runs?')[0]}/runs/{best.mlflow_run_id})" \
        if view and "#" in view and best.mlflow_run_id else ""
    carried = sweep.warm_start
    began = (f" The study began with {carried.trials} trial(s) of sweep {carried.sweep} (best valid_acc "
             f"{carried.best:.4f}); they are that sweep's runs." if carried is not None and carried.best is not None
             else "")
    close = (f" The validation set cannot tell it from {', '.join(ranking.close)}: their gaps to it are within "
             "chance." if ranking.close else "")
    shown = model_card.accuracy_words(best.best_valid_acc, n_valid, baseline.accuracy)
    parent.set_tags({"trials": str(len(records)),    # its child runs are these and its ensembles (``ensembles``)
                     "close_trials": ",".join(ranking.close) or "none",
                     "best_trial_id": best.label, "best_ray_trial_id": best.trial_id,
                     "best_checkpoint": best.checkpoint or "",
                     "best_mlflow_run_id": best.mlflow_run_id or "", "best_config": label,
                     "mlflow.note.content": f"Best trial: [{label}]{link} ({trial_said(best.label)}, run "
                                            f"{best.mlflow_run_id}), best valid_acc {shown}; its config is "
                                            f"the `best.*` params and the artifact `best_config.yaml`.{close}{began}"})
    if best.mlflow_run_id:
        for earlier in tracker.find_runs(sweep.experiment or "", {"sweep": sweep.name, "best_in_sweep": "true"}):
            if earlier.run_id != best.mlflow_run_id and earlier.parent_run_id == parent.run_id:
                tracker.attach(earlier.run_id).set_tags({"best_in_sweep": "false", "mlflow.note.content":  # before a resume
                                                         f"A trial of sweep {sweep.name}; its best is {best.label}."})
        tracker.attach(best.mlflow_run_id).set_tags({"best_in_sweep": "true", "mlflow.note.content":
                                                     f"The best trial of sweep {sweep.name}."})
    parent.log_artifact(best_config)
    parent.log_artifact(sweep_dir / SWEEP_RECORD)
    parent.end("FAILED" if parent.lost else "FINISHED")
    return label, view


def _card(sweep: SweepRecord, best: TrialRecord, label: str, baseline: BaselineResult) -> ModelCard:
    """What the best trial's registered model says of itself: a reader of the sweep's model kind
    and dataset, its valid accuracy beside the baseline, and the trial and run it came from."""
    return model_card.card(kind="reader", model=best.config.model.kind, dataset=best.config.dataset,
                           valid_acc=best.best_valid_acc, n=baseline.examples, baseline=baseline.accuracy,
                           origin=f"The best {trial_said(best.label)} ({label}) of sweep {sweep.name}: run "
                                  f"{best.mlflow_run_id} of experiment {sweep.experiment}; its checkpoint is "
                                  f"`{best.checkpoint}`.")


def write_best_config(best: TrialRecord, path: Path, sweep: str, train_epochs: float | None,
                      data: Path | None, precision: str = "auto") -> None:
    """The best trial's config, for ``iaa-cli train --config PATH`` with no other flag.

    Its ``train.max_epochs`` is a training length (``train_epochs``, unless the sweep searched
    it): early stopping ends the run sooner. The sweep's per-trial budget is kept apart as
    ``sweep.trial_max_epochs``, and ``data`` names the prepared folder the sweep read (absent: the
    config's ``dataset`` under the work folder). Its ``train.precision`` is the sweep's as
    configured (``precision``): ``auto``, which the sweep decided for its own machine, is decided
    again where the file trains (bf16 pays on some CPUs and costs several times on others).
    """
    trial_epochs = best.config.train.max_epochs
    cfg = replace(best.config, train=replace(best.config.train, precision=precision))
    if train_epochs is not None and "train.max_epochs" not in best.params:
        cfg = replace(cfg, train=replace(cfg.train, max_epochs=float(train_epochs)))
    handoff: dict[str, Any] = {"data": str(Path(data).resolve())} if data is not None else {}
    handoff["sweep"] = {"name": sweep, "trial": best.label, "best_valid_acc": best.best_valid_acc,
                        "trial_max_epochs": trial_epochs}
    dump_yaml(cfg, path, handoff, header=(
        f"The best configuration of sweep {sweep} ({trial_said(best.label)}).\n"
        f"`iaa-cli train` with this file as its config trains it for up to train.max_epochs, stopping early after\n"
        f"train.patience checks without improvement; each trial of the sweep had sweep.trial_max_epochs."))


EXPLAIN_EXAMPLES = 5  # validation examples on the best trial's explain page


def best_outputs(best: TrialRecord, tracker: Tracker, sweep_dir: Path, prepared: Path, register: str | None,
                  records: Sequence[TrialRecord] = (), card: ModelCard | None = None) -> tuple[dict[str, Any], list[str]]:
    """Every trial's tracked model, and the best trial's explain page (first validation examples),
    both stored on their runs; ``register`` registers the best model, described by ``card``.

    Returns the outputs and what the store refused for good, run by run: those runs are marked
    FAILED, and the sweep's result stands (every output is written before the command fails)."""
    from iaa.jobs.evaluation.predictor import MODEL_CODE

    if not best.checkpoint or not Path(best.checkpoint).is_file():
        return {}, []
    runs = []
    for trial in records:             # every trained reader is a logged model; the best one comes last
        if trial is not best and trial.mlflow_run_id and trial.checkpoint and Path(trial.checkpoint).is_file():
            runs.append(tracker.attach(trial.mlflow_run_id))
            tracker.log_model(runs[-1], ModelFiles.of(trial.checkpoint, prepared), code=MODEL_CODE)
    page = _explain_best(best, sweep_dir, prepared)
    out: dict[str, Any] = {"explain_page": page.html, "explain_png": page.png}
    if best.mlflow_run_id:
        run = tracker.attach(best.mlflow_run_id)
        runs.append(run)
        for artifact in (page.html, page.png):
            run.log_artifact(Path(artifact), "explain")
        out["model_uri"] = tracker.log_model(run, ModelFiles.of(best.checkpoint, prepared), register, code=MODEL_CODE,
                                             card=card)
    unlogged = []
    for run in runs:
        if run.lost:
            run.end("FAILED")
            unlogged.append(f"run {run.run_id} (marked FAILED) lacks {', '.join(run.lost)}")
    return out, unlogged
