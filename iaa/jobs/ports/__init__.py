"""The ports of the jobs: what a workflow needs from run tracking, from a cluster and from a server.

Jobs are written against these protocols and never import :mod:`iaa.platform`, which holds
the adapters: :class:`iaa.platform.tracking.tracker.MlflowTracker` (a :class:`Tracker`) and
:class:`iaa.platform.sweeps.launch.RayLauncher` (a :class:`Launcher`). ``iaa.cli`` builds them and
hands them to the jobs. The adapters import from :mod:`iaa.jobs` only these ports, the configs
and the work folder's paths: the job code they run (the training loop, the predictor) reaches
them as callables the job passes in, and the records they share with the jobs live here.

One module per concern, each depending only on the records:

- :mod:`~iaa.jobs.ports.records`: the records the ports carry (runs, trials, serve settings);
- :mod:`~iaa.jobs.ports.tracking`: :class:`Tracker` and :class:`TrackedRun`;
- :mod:`~iaa.jobs.ports.launching`: :class:`Launcher`, the worker's link and loop, the requests;
- :mod:`~iaa.jobs.ports.serving`: the serve job's code and a replica's model;
- :mod:`~iaa.jobs.ports.workflows`: a use case's workflow that another runs (:class:`TrainWorkflow`);
- :mod:`~iaa.jobs.ports.analysis`: a sweep's study read back (:class:`StudyAnalyzer` and its records);
- :mod:`~iaa.jobs.ports.mapping`: the work a job maps over the cluster (:class:`TagMap`, :class:`MemberScore`).

Every name is importable from this package as well.
"""

from __future__ import annotations

from iaa.jobs.ports.analysis import BestTrial, HistoryPoint, StudyAnalysis, StudyAnalyzer, StudyTrial
from iaa.jobs.ports.launching import (Carried, ConnectRequest, Launcher, MembersRequest, Placement, RestoresSpent,
                                      Scorer, SearchPlan, SweepEvents, SweepRequest, TrialRun, TrialTracking,
                                      WarmStart, WorkerData, WorkerFit, WorkerLink, WorkersRequest)
from iaa.jobs.ports.mapping import MemberScore, TagMap
from iaa.jobs.ports.records import (CHECKPOINT_FILE, CHECKPOINT_SCORE, FAILED_STATUSES, MEMBER_KEY, MODEL_PREFIXES,
                                    Limits, LoadedModel, MetricPoint, Metrics, MetricsCallback, ModelCard, ModelFiles, ModelSource,
                                    RequestError, RunRecord, ServeApi, ServeConfig, TIME_BUDGET, TrialRecord,
                                    INTERRUPTED_TAG, TUNE_RUN_TAG, WORKER_LOST, trial_name, trial_said)
from iaa.jobs.ports.serving import ModelFetcher, ServeCode, ServedModel, ServeLoader
from iaa.jobs.ports.tracking import Answerer, ModelCode, TrackedRun, Tracker
from iaa.jobs.ports.workflows import TrainRun, TrainWorkflow

__all__ = [
    "CHECKPOINT_FILE", "CHECKPOINT_SCORE", "FAILED_STATUSES", "MEMBER_KEY", "MODEL_PREFIXES", "TIME_BUDGET",
    "INTERRUPTED_TAG", "TUNE_RUN_TAG", "WORKER_LOST",
    "Answerer", "Carried", "ConnectRequest", "Launcher", "Limits", "LoadedModel", "MembersRequest", "MetricPoint", "Metrics",
    "MetricsCallback", "ModelCard", "ModelCode", "ModelFetcher", "ModelFiles", "ModelSource", "Placement", "RequestError", "RestoresSpent", "RunRecord", "Scorer",
    "SearchPlan", "ServeApi", "ServeCode", "ServeConfig", "ServedModel", "ServeLoader", "SweepEvents", "SweepRequest", "TrackedRun",
    "Tracker", "TrialRecord", "TrialRun", "TrialTracking", "WarmStart", "WorkerData", "WorkerFit", "WorkerLink", "WorkersRequest",
    "TrainRun", "TrainWorkflow",
    "MemberScore", "TagMap",
    "BestTrial", "HistoryPoint", "StudyAnalysis", "StudyAnalyzer", "StudyTrial",
    "trial_name",
    "trial_said",
]
