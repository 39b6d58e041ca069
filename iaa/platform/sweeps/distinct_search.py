"""Optuna's TPE through Ray Tune: each configuration of a finite space once, ASHA's stops as prunes.

Trials of one sweep share ``train.seed``, so two trials with the same configuration train the
same model to the same accuracy: the second is pure waste. TPE samples its first
``n_startup_trials`` (10) at random, with replacement, and a small categorical space repeats
itself quickly (8 configurations, 4 trials: a repeat in 59% of sweeps). :class:`DistinctSampler`
draws a whole configuration at once (Optuna's relative sampling) and draws again while it
repeats one the study already holds, so the study never records a discarded repeat. Once every
configuration of the space is taken, repeats are allowed. Its first trials follow a seeded
space-filling design (:mod:`~iaa.platform.sweeps.space_filling`), so that every searched value is
tried before TPE takes over.

:class:`StudySearch` also makes the study tell what happened: every check's ``valid_acc`` is an
intermediate value (step = the check), and a trial that ASHA stopped is PRUNED, not COMPLETE.
The objective is named ``valid_acc``, and each trial carries the user attributes
``tune_trial_id`` and ``mlflow_run_id`` (from ``run_ids``, which the sweep's MLflow callback
fills), so optuna-dashboard, Tune's folders and MLflow's runs name the same trials.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Mapping

from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState
from ray.tune.search.optuna import OptunaSearch

from iaa.jobs.config import exploration
from iaa.jobs.config.presets import STOP_METRIC
from iaa.platform.sweeps.space_filling import stratified_config

OBJECTIVE_NAME = "valid_acc"   # the study's objective: a trial's best validation accuracy
MAX_REDRAWS = 50   # draws per proposal before a repeat is accepted (a range space almost never repeats)


class DistinctSampler(BaseSampler):
    """``inner`` (TPE), proposing a configuration the study has not tried while there is one.

    Args:
        inner: the sampler that proposes: jointly where it models the parameters together
            (``infer_relative_search_space`` and ``sample_relative``: multivariate TPE once its
            start-up trials are done), one parameter at a time (``sample_independent``) for the rest.
        space: the search space's distributions by name.
        size: the number of distinct configurations (None: unbounded, ranges).
        seed: seeds the start-up design of the first trials; None: ``inner`` proposes from the first.
    """

    def __init__(self, inner: BaseSampler, space: Mapping[str, BaseDistribution], size: int | None,
                 seed: int | None = None) -> None:
        self.inner, self.space, self.size, self.seed = inner, dict(space), size, seed

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        taken = {_key(t.params) for t in study.get_trials(deepcopy=False) if t.number != trial.number and t.params}
        exhausted = self.size is not None and len(taken) >= self.size
        if self.seed is not None and search_space == self.space:
            designed = stratified_config(self.space, self.seed, trial.number)
            if designed is not None and (exhausted or _key(designed) not in taken):
                return designed
        joint = {name: dist for name, dist in self.inner.infer_relative_search_space(study, trial).items()
                 if name in search_space}
        config: dict[str, Any] = {}
        for _ in range(MAX_REDRAWS):
            config = self._propose(study, trial, search_space, joint)
            if exhausted or _key(config) not in taken:
                break
        return config

    def _propose(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution],
                 joint: dict[str, BaseDistribution]) -> dict[str, Any]:
        """One configuration from ``inner``: its joint (relative) proposal over ``joint``, and each
        parameter it left out (all of them before TPE's start-up trials end) drawn on its own."""
        proposal = self.inner.sample_relative(study, trial, joint) if joint else {}
        return {name: proposal[name] if name in proposal else
                self.inner.sample_independent(study, trial, name, dist) for name, dist in search_space.items()}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


class StudySearch(OptunaSearch):
    """``OptunaSearch`` whose study records each check and ASHA's stops truthfully, with a named
    objective and each trial's Tune trial id and MLflow run id."""

    run_ids: Mapping[str, str] = {}      # Tune trial id -> MLflow run id, filled while trials start

    def _setup_study(self, mode: Any) -> None:
        super()._setup_study(mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)     # stable in use since Optuna 3.2
            self._ot_study.set_metric_names([OBJECTIVE_NAME])

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        config = super().suggest(trial_id)
        if trial_id in self._ot_trials:
            self._ot_trials[trial_id].set_user_attr("tune_trial_id", trial_id)
        return config

    def _live(self, trial_id: str) -> Any:
        """The Optuna trial of Tune trial ``trial_id``; one that a stop ended FAIL while Tune kept
        the trial to continue comes back as a new RUNNING trial with its values and checks so far."""
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return ot_trial
        frozen = self._ot_study._storage.get_trial(ot_trial._trial_id)
        if not frozen.state.is_finished():
            return ot_trial
        self._ot_study.enqueue_trial(frozen.params, user_attrs={
            **{k: v for k, v in frozen.user_attrs.items() if k not in ("interrupted", "killed")},
            "continues_trial": frozen.number})
        revived = self._ot_study.ask(fixed_distributions=self._space)
        for step, value in sorted(frozen.intermediate_values.items()):
            revived.report(value, step)
        self._ot_trials[trial_id] = revived
        return revived

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        ot_trial = self._live(trial_id)
        if ot_trial is None or trial_id in self._completed_trials or STOP_METRIC not in result:
            return
        if self.run_ids.get(trial_id) and "mlflow_run_id" not in ot_trial.user_attrs:
            ot_trial.set_user_attr("mlflow_run_id", self.run_ids[trial_id])
        step = int(result.get("checks") or result.get("training_iteration") or 0)
        if step not in self._ot_study._storage.get_trial(ot_trial._trial_id).intermediate_values:
            ot_trial.report(float(result[STOP_METRIC]), step)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """A trial that ended without a reason of its own was stopped by ASHA: PRUNED (Optuna
        then takes its last intermediate value); others COMPLETE with their best accuracy."""
        self._live(trial_id)
        if not error and result and not result.get("stop_reason") and trial_id in self._ot_trials \
                and trial_id not in self._completed_trials:
            self.on_trial_result(trial_id, result)    # the check ASHA stopped on reaches only this call
            ot_trial = self._ot_trials[trial_id]
            ot_trial.set_user_attr("stopped_by", "asha")
            self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
            self._completed_trials.add(trial_id)
            self._note_exploration()
            return
        if not error and result and trial_id in self._ot_trials and trial_id not in self._completed_trials:
            self.on_trial_result(trial_id, result)    # a last check that Tune delivers only with the end
        super().on_trial_complete(trial_id, result, error)
        self._note_exploration()

    def _note_exploration(self) -> None:
        """The study's ``notes`` (shown by optuna-dashboard): a searched parameter that never varied
        in the scored trials, and too few of them to rank importances; refreshed as trials end."""
        scored = self._ot_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        self._ot_study.set_user_attr("notes", exploration.notes([t.params for t in scored], list(self._space)))


def _key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)
