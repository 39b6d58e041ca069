"""The one composition step: the adapters a command hands its job (the MLflow tracker, the Ray
launcher), imported only when a command builds them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from iaa.jobs.workdir.paths import Workdir

if TYPE_CHECKING:
    from iaa.jobs.ports import Launcher, Tracker
    from iaa.jobs.ports import StudyAnalyzer

# The code file of the models the tracker logs, which MLflow runs to load one (never imported here:
# running it sets MLflow's model).
MODEL_FILE = Path(__file__).with_name("logged_model.py")


def workdir_tracker(workdir: Path, tracking_uri: str | None) -> Tracker:
    """The jobs' Tracker: the MLflow store of ``--tracking-uri`` (or the workdir's, in a writable
    workdir), checked."""
    from iaa.platform.tracking.tracker import MlflowTracker

    Workdir(workdir).writable()
    return MlflowTracker(Workdir(workdir).tracking_uri(tracking_uri), MODEL_FILE)


def ray_launcher(address: str | None, storage_path: str | None) -> Launcher:
    """The jobs' Launcher: the Ray cluster at ``--address`` (default: a local one)."""
    from iaa.platform.sweeps.launch import RayLauncher

    return RayLauncher(address, storage_path)


def open_tracker(uri: str) -> Tracker:
    """The MLflow Tracker at ``uri``, imported only when a job opens it (after its inputs are checked)."""
    from iaa.platform.tracking.tracker import MlflowTracker

    return MlflowTracker(uri, MODEL_FILE)


def study_analyzer() -> StudyAnalyzer:
    """The jobs' StudyAnalyzer: a sweep's Optuna study read back, its figures drawn with matplotlib."""
    from iaa.platform.sweeps.studies.study import analyze

    return analyze
