"""The module paths that a sweep's saved Tune state names, kept for sweeps saved before this
package took its sub-packages (``search``, ``studies``, ``trials``).

Ray Tune pickles a run's searcher (its sampler inside), scheduler and callbacks by module path
(``tuner.pkl``, ``search_gen_state-*.json``) and loads them on ``--resume``. A sweep stopped by
an earlier version names ``iaa.platform.sweeps.trial_runs.TrialRuns``, for one; :func:`keep`
makes each such path the module that holds the class now, so that the sweep resumes.
"""

from __future__ import annotations

import sys
from types import ModuleType

from iaa.platform.sweeps.search import asha, distinct_search, search_algorithm
from iaa.platform.sweeps.trials import trial_events, trial_runs

# the path an earlier version pickled -> the module that holds its classes now (``trial_runs``
# also names ``ConsoleCallback``, which it held before ``trial_events`` did)
EARLIER: dict[str, ModuleType] = {
    "iaa.platform.sweeps.asha": asha,                          # GivenAside
    "iaa.platform.sweeps.distinct_search": distinct_search,    # StudySearch, DistinctSampler
    "iaa.platform.sweeps.search_algorithm": search_algorithm,  # GridOnce
    "iaa.platform.sweeps.trial_events": trial_events,          # ConsoleCallback
    "iaa.platform.sweeps.trial_runs": trial_runs,              # TrialRuns, ConsoleCallback
}


def keep() -> None:
    """Let unpickling find each earlier path (pickle imports a path that ``sys.modules`` holds as it stands)."""
    for path, module in EARLIER.items():
        sys.modules.setdefault(path, module)
