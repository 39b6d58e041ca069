"""An Optuna sampler through Ray Tune: each configuration of a finite space once, ASHA's stops as prunes.

Trials of one sweep share ``train.seed``, so two trials with the same configuration train the
same model to the same accuracy: the second is pure waste. TPE samples its first
``n_startup_trials`` (10) at random, with replacement, and a small categorical space repeats
itself quickly (8 configurations, 4 trials: a repeat in 59% of sweeps). :class:`DistinctSampler`
draws a whole configuration at once (Optuna's relative sampling) and draws again while it
repeats one the study already holds, so the study never records a discarded repeat; a sampler
that keeps coming back to a configuration the study holds (a Gaussian process's optimum of its
acquisition) is redrawn at random. Once every configuration of the space is taken, repeats are
allowed. Its first trials follow a seeded
space-filling design (:mod:`~iaa.platform.sweeps.search.space_filling`), so that every searched value is
tried before TPE takes over.

:class:`StudySearch` also makes the study tell what happened: every check's ``valid_acc`` is an
intermediate value (step = the check), and a trial that ASHA stopped is PRUNED, not COMPLETE.
The objective is named ``valid_acc``, and each trial carries the user attributes
``tune_trial_id`` and ``mlflow_run_id`` (from ``run_ids``, which the sweep's MLflow callback
fills), so optuna-dashboard, Tune's folders and MLflow's runs name the same trials.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState
from ray.tune.search import Searcher

from iaa.errors import IaaError
from iaa.files import DiskFullError, disk_full
from iaa.jobs.config import exploration
from iaa.jobs.config.presets import MODE, SEARCH_METRIC, STOP_METRIC
from iaa.jobs.ports import INTERRUPTED_TAG, trial_name
from iaa.platform.cluster.owner import owner
from iaa.platform.sweeps import driver_side
from iaa.platform.sweeps.studies.given import TRIED_FIRST, is_given
from iaa.platform.sweeps.studies.orphans import OWNER_ATTR
from iaa.platform.sweeps.search.space_filling import points, stratified_config
from iaa.platform.sweeps.studies.study_store import quiet_optuna, study_full, study_storage, study_writes
from iaa.platform.sweeps.studies.carried_trials import CARRIED_FROM

OBJECTIVE_NAME = "valid_acc"   # the study's objective: a trial's best validation accuracy
MAX_REDRAWS = 50   # draws per proposal before a repeat is accepted (a range space almost never repeats)
CYCLE = 3          # inner proposing one taken configuration this often: the rest of the draws are random
MAX_ENUMERATED = 100_000   # a finite space up to this size: a random draw picks among its untried configurations
STOP_MARKS = {INTERRUPTED_TAG, "killed", "disk_full"}   # user attributes of a trial a stop ended FAIL


class DistinctSampler(BaseSampler):
    """``inner`` (TPE, GP, random, CMA-ES), proposing a configuration the study has not tried while there is one.

    Args:
        inner: the sampler that proposes: jointly where it models the parameters together
            (``infer_relative_search_space`` and ``sample_relative``: multivariate TPE once its
            start-up trials are done, GP, CMA-ES's numeric parameters), one parameter at a time
            (``sample_independent``) for the rest.
        space: the search space's distributions by name.
        size: the number of distinct configurations (None: unbounded, ranges).
        seed: seeds the start-up design of the first trials; None: ``inner`` proposes from the first.
    """

    def __init__(self, inner: BaseSampler, space: Mapping[str, BaseDistribution], size: int | None,
                 seed: int | None = None) -> None:
        self.inner, self.space, self.size, self.seed = inner, dict(space), size, seed
        self._random: RandomSampler | None = None

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        trials = study.get_trials(deepcopy=False)
        taken = {_key(t.params) for t in trials if t.number != trial.number and t.params}
        exhausted = self.size is not None and len(taken) >= self.size
        if self.seed is not None and search_space == self.space and not is_given(trial):
            # the design's next point: one per configuration the study's earlier trials hold, so
            # neither the given configurations (whose keys left out ``inner`` proposes) nor a
            # stopped trial and its continuation (two trials, one configuration) pass one by
            earlier = {_key(t.params) for t in trials if t.number < trial.number and t.params and not is_given(t)}
            designed = stratified_config(self.space, self.seed, len(earlier))
            if designed is not None and (exhausted or _key(designed) not in taken):
                return designed
        joint = {name: dist for name, dist in self.inner.infer_relative_search_space(study, trial).items()
                 if name in search_space}
        config: dict[str, Any] = {}
        proposed: Counter[str] = Counter()     # the taken configurations inner proposed, and how often
        for _ in range(MAX_REDRAWS):
            stuck = max(proposed.values(), default=0) >= CYCLE   # inner cycles among taken ones
            config = (self._at_random(study, trial, search_space, taken) if stuck
                      else self._propose(study, trial, search_space, joint))
            key = _key(config)
            if exhausted or key not in taken:
                break
            proposed[key] += 1
        return config

    def _at_random(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution],
                   taken: set[str]) -> dict[str, Any]:
        """A configuration drawn at random (seeded by ``seed``), for an ``inner`` that repeats itself:
        in a finite space, one of the untried configurations; in a range, any."""
        values = [points(dist) for dist in search_space.values()]
        if self.size is not None and self.size <= MAX_ENUMERATED and all(v is not None for v in values):
            untried = [config for combo in itertools.product(*values)
                       if _key(config := dict(zip(search_space, combo))) not in taken]
            if untried:
                return random.Random(f"{self.seed}:{trial.number}").choice(untried)
        if getattr(self, "_random", None) is None:      # absent from a sampler saved by an earlier version
            self._random = RandomSampler(seed=self.seed)
        return {name: self._random.sample_independent(study, trial, name, dist) for name, dist in search_space.items()}

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


class StudySearch(Searcher):
    """Ray Tune's searcher over an Optuna study, driven through Optuna's ask-and-tell interface.

    Each Tune trial is one Optuna trial: ``suggest`` asks, every check is reported, the end is told
    (COMPLETE with the trial's best accuracy, PRUNED where ASHA stopped it, FAIL on an error). The
    study itself (its storage and name) and the MLflow run ids come from the process that runs the
    sweep (:mod:`~iaa.platform.sweeps.driver_side`, under ``sweep``); what Tune saves of the
    searcher is plain data, so a resumed sweep, in this folder or a copy, writes to the study it
    runs with now. Without a bound study (``sweep`` None) the study lives in memory.

    Args:
        space: the search space's Optuna distributions by name.
        sampler: the study's sampler (:class:`DistinctSampler`).
        sweep: the Tune run whose :class:`~iaa.platform.sweeps.driver_side.DriverSide` holds the study.
        given: configurations (some or all of the searched parameters) that the first trials run,
            in order, each enqueued just before it is asked (a stop never leaves one waiting) and
            marked with the user attribute ``tried_first`` (its index), which a resumed sweep
            reads to go on with the next. Their Tune trial ids (``given_ids``) go to the sweep's
            ``DriverSide.given``, where its scheduler leaves them out of ASHA.
    """

    def __init__(self, space: Mapping[str, BaseDistribution], sampler: BaseSampler, sweep: str | None = None,
                 metric: str = SEARCH_METRIC, mode: str = MODE, given: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(metric=metric, mode=mode)
        self.space, self.sampler, self.sweep = dict(space), sampler, sweep
        self.given = tuple(dict(c) for c in given)
        self.numbers: dict[str, int] = {}       # Tune trial id -> the number of its Optuna trial
        self.completed: set[str] = set()
        self.given_ids: set[str] = set()         # Tune trial ids that run a given configuration
        self._study: optuna.Study | None = None
        self._live: dict[str, optuna.Trial] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_study": None, "_live": {}}

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return False                             # the space is ours; Tune's config searches nothing

    def save(self, checkpoint_path: str) -> None:
        Path(checkpoint_path).write_text(json.dumps({"numbers": self.numbers, "completed": sorted(self.completed),
                                                     "given": sorted(getattr(self, "given_ids", ()))}),
                                         encoding="utf-8")

    def restore(self, checkpoint_path: str) -> None:
        try:
            state = json.loads(Path(checkpoint_path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise IaaError(f"{checkpoint_path}: the searcher's state was saved by an earlier version of iaa and "
                           "cannot be continued; run the sweep again under another `name`") from None
        self.numbers, self.completed = dict(state["numbers"]), set(state["completed"])
        self.given_ids = set(state.get("given", ()))
        self._live = {}
        if self.sweep is not None and driver_side.is_bound(self.sweep):
            driver_side.of(self.sweep).given.update(self.given_ids)     # the scheduler sets them aside

    @property
    def study(self) -> optuna.Study:
        """The sweep's study, opened at first use from what this process bound to the sweep."""
        if self._study is None:
            quiet_optuna()                       # a restored searcher was not built by searcher(), which does it too
            side = driver_side.of(self.sweep) if self.sweep is not None else None
            url, name = (side.study_storage, side.study_name) if side is not None else (None, None)
            with study_writes(url or "", f"keep the study {name}"):
                self._study = optuna.create_study(storage=study_storage(url) if url else None, sampler=self.sampler,
                                                  study_name=name, direction="maximize" if self.mode == "max"
                                                  else "minimize", load_if_exists=True)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ExperimentalWarning)     # stable in use since Optuna 3.2
                    self._study.set_metric_names([OBJECTIVE_NAME])
        return self._study

    def _full(self, err: BaseException, failed: str) -> bool:
        """Whether ``err``, met writing the study, is a full disk; if so it is noted for the sweep,
        which stops at its next step (:mod:`~iaa.platform.sweeps.trials.full_disk`), and the write is
        left undone: Tune is not told an error of its searcher (a traceback, and no stop)."""
        if not disk_full(err) and not isinstance(err, DiskFullError):
            return False
        if self.sweep is None or not driver_side.is_bound(self.sweep):
            return False
        side = driver_side.of(self.sweep)
        side.note_full(err if isinstance(err, DiskFullError) else study_full(side.study_storage or "", failed))
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        try:
            return self._suggest(trial_id)
        except Exception as err:
            if self._full(err, f"ask for trial {trial_id}"):
                return None
            raise

    def _suggest(self, trial_id: str) -> dict[str, Any] | None:
        cut_off = self._cut_off()
        if cut_off is not None:                  # its configuration and name again, from the beginning
            trial = self._ask_again(cut_off, checks=False)
            if self.sweep is not None and driver_side.is_bound(self.sweep):
                driver_side.of(self.sweep).again[trial_id] = cut_off.user_attrs["tune_trial_id"]
            given = cut_off.user_attrs.get(TRIED_FIRST)
        else:
            given = self._next_given()
            if given is not None:
                self.study.enqueue_trial(self.given[given], user_attrs={TRIED_FIRST: given})
            trial = self.study.ask(fixed_distributions=self.space)
            trial.set_user_attr(OWNER_ATTR, owner())    # who runs it: a later command fails it once that is gone
            trial.set_user_attr("trial_name", trial_name(trial.number))
        if given is not None:
            self.given_ids.add(trial_id)
            if self.sweep is not None and driver_side.is_bound(self.sweep):
                driver_side.of(self.sweep).given.add(trial_id)    # the scheduler sets it aside
        trial.set_user_attr("tune_trial_id", trial_id)
        self.numbers[trial_id], self._live[trial_id] = trial.number, trial
        if self.sweep is not None and driver_side.is_bound(self.sweep):
            driver_side.of(self.sweep).numbers[trial_id] = trial.number   # the trial's run takes this number too
        return dict(trial.params)

    def _cut_off(self) -> FrozenTrial | None:
        """The first trial that a stop cut off before Tune saved it, to run again under its name.

        Tune saves a sweep every few seconds (``TUNE_GLOBAL_CHECKPOINT_S``), its searcher with it.
        A trial asked after the last save is unknown to the resumed sweep, which asks for a trial
        in its place; without this, that place would go to a new configuration, and the one cut
        off, counted as tried, would be skipped. Such a trial ended FAIL with a stop's mark, its
        Tune id is neither restored nor asked here, and no later trial continues it."""
        trials = self.study.get_trials(deepcopy=False)
        continued = {t.user_attrs.get("continues_trial") for t in trials}
        return next((t for t in trials if t.state == TrialState.FAIL and STOP_MARKS & t.user_attrs.keys()
                     and t.user_attrs.get("tune_trial_id") not in (None, *self.numbers)
                     and t.number not in continued and CARRIED_FROM not in t.user_attrs), None)

    def _next_given(self) -> int | None:
        """The index of the first given configuration that no trial of this sweep has run and that
        no trial carried from an earlier sweep ran whole (the sampler knows its score)."""
        if not getattr(self, "given", ()):         # absent from a searcher saved by an earlier version
            return None
        trials = self.study.get_trials(deepcopy=False)
        run = {t.user_attrs[TRIED_FIRST] for t in trials if is_given(t)}
        carried = [t.params for t in trials if CARRIED_FROM in t.user_attrs]
        return next((i for i, config in enumerate(self.given) if i not in run and config not in carried), None)

    def _trial(self, trial_id: str) -> optuna.Trial | None:
        """The live Optuna trial of Tune trial ``trial_id``; None once it was told its end. One that
        a stop ended FAIL while Tune kept the trial to continue, or that a process now gone asked
        (a resumed sweep), comes back as a new RUNNING trial with the same configuration and its
        checks so far."""
        live = self._live.get(trial_id)
        number = live.number if live is not None else self.numbers.get(trial_id)
        frozen = self._frozen(number) if number is not None else None
        if frozen is None:
            return None
        if frozen.state == TrialState.RUNNING:
            if live is not None:
                return live
            self.study.tell(frozen.number, state=TrialState.FAIL)    # asked by a process that is gone
        elif frozen.state != TrialState.FAIL:                         # COMPLETE or PRUNED: told already
            self.completed.add(trial_id)
            return None
        revived = self._ask_again(frozen, checks=True)
        self.numbers[trial_id], self._live[trial_id] = revived.number, revived
        return revived

    def _ask_again(self, frozen: FrozenTrial, checks: bool) -> optuna.Trial:
        """A new RUNNING trial with ``frozen``'s configuration and user attributes (its name, its
        Tune id) but for a stop's marks, noted as continuing it; with its ``checks`` so far or none."""
        attrs = {k: v for k, v in frozen.user_attrs.items() if k not in (*STOP_MARKS, OWNER_ATTR)}
        self.study.enqueue_trial(frozen.params, user_attrs={**attrs, "continues_trial": frozen.number})
        again = self.study.ask(fixed_distributions=self.space)
        again.set_user_attr(OWNER_ATTR, owner())
        for step, value in sorted(frozen.intermediate_values.items()) if checks else ():
            again.report(value, step)
        return again

    def _frozen(self, number: int) -> FrozenTrial | None:
        found = [t for t in self.study.get_trials(deepcopy=False) if t.number == number]
        return found[0] if found else None

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        try:
            self._result(trial_id, result)
        except Exception as err:
            if not self._full(err, f"record a check of trial {trial_id}"):
                raise

    def _result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self.completed or STOP_METRIC not in result:
            return
        trial = self._trial(trial_id)
        if trial is None:
            return
        run_ids = driver_side.of(self.sweep).run_ids if self.sweep and driver_side.is_bound(self.sweep) else {}
        frozen = self._frozen(trial.number)
        if run_ids.get(trial_id) and frozen is not None and "mlflow_run_id" not in frozen.user_attrs:
            trial.set_user_attr("mlflow_run_id", run_ids[trial_id])
        step = int(result.get("checks") or result.get("training_iteration") or 0)
        if frozen is None or step not in frozen.intermediate_values:
            trial.report(float(result[STOP_METRIC]), step)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """A trial that ended without a reason of its own was stopped by ASHA: PRUNED (Optuna
        then takes its last intermediate value); others COMPLETE with their best accuracy."""
        try:
            self._complete(trial_id, result, error)
        except Exception as err:                     # not told: the next command fails the trial
            if not self._full(err, f"record the end of trial {trial_id}"):
                raise

    def _complete(self, trial_id: str, result: dict[str, Any] | None, error: bool) -> None:
        if trial_id in self.completed:
            return
        if result:
            self._result(trial_id, result)   # a last check that Tune delivers only with the end
        trial = self._trial(trial_id)
        if trial is None:
            return
        value = (result or {}).get(self.metric)
        if error or (value is None and not result):
            self.study.tell(trial, state=TrialState.FAIL)
        elif not result.get("stop_reason"):
            trial.set_user_attr("stopped_by", "asha")
            self.study.tell(trial, state=TrialState.PRUNED)
        elif value is None or not math.isfinite(float(value)):
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, float(value))
        if not error:                # an errored trial that a resumed sweep runs again comes back
            self.completed.add(trial_id)
        self._live.pop(trial_id, None)
        self._note_exploration()

    def _note_exploration(self) -> None:
        """The study's ``notes`` (shown by optuna-dashboard): a searched parameter that never varied
        in the scored trials, and too few of them to rank importances; refreshed as trials end."""
        scored = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        self.study.set_user_attr("notes", exploration.notes([t.params for t in scored], list(self.space)))


def _key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)
