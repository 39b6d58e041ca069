"""Placement groups of multi-worker trials that ASHA stops are released (by Ray Train's own cleaner).

When Tune stops a trial whose driver runs a 2-worker ``TorchTrainer``, it kills the Train
controller, which never releases its workers' placement group. Ray Train's cleaner actor frees it
once the State API (``ray[default]``: the dashboard) reports the controller dead. On this 2-CPU
cluster one trial's workers take both CPUs, so a leaked placement group stalls the next trial
until the timeout fails the test, and a leak at the last trial fails the final check.
A second Ray cluster runs on the machine meanwhile: the State API must still find the right one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._platform import read_sweep
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# A learning rate that learns nothing next to one that learns: the seeded sweep (trials run one at
# a time, in a fixed order) has trials that ASHA stops at their first rung.
SPACE = "train.lr: [1.0e-7, 0.05]\nmodel.hidden_dim: [8, 12]\n"
OTHER_CLUSTER = ("import ray, time; ray.init(num_cpus=1, include_dashboard=False, logging_level='ERROR'); "
                 "print('up', flush=True); time.sleep(3600)")


@pytest.fixture
def other_cluster():
    """Another local Ray on this machine, as a second user's sweep would be."""
    proc = subprocess.Popen([sys.executable, "-c", OTHER_CLUSTER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    yield
    proc.terminate()
    proc.wait(timeout=60)


@pytest.fixture
def own_ray():
    """The platform starts its own local Ray (dashboard included); shut it down afterwards."""
    import ray

    assert not ray.is_initialized()
    yield
    ray.shutdown()


def _live_groups() -> list[str]:
    from ray.util import placement_group_table

    return [pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"]


def test_asha_stopped_two_worker_trials_release_their_placement_groups(tmp_path: Path, other_cluster: None,
                                                                       own_ray: None, monkeypatch) -> None:
    from tests._platform import run_sweep

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tiny = make_tiny_prepared(tmp_path / "data")
    space = tmp_path / "space.yaml"
    space.write_text(SPACE, encoding="utf-8")
    run_sweep(dataset="cbt-ne", data=tiny, num_samples=2, search_space=space, sets=TINY_SETS,
              workdir=tmp_path / "work", name="pg", workers_per_trial=2, seed=0, show_progress=False,
              grace_period=2)              # the schedule whose stops this seed's trials are known to meet
    trials = read_sweep(tmp_path / "work", "pg")["trials"]
    assert len(trials) == 2 and all(t["status"] == "TERMINATED" for t in trials)
    assert any(t["stop_reason"] == "asha" for t in trials), [t["stop_reason"] for t in trials]
    deadline = time.time() + 60          # the cleaner polls every second
    while _live_groups() and time.time() < deadline:
        time.sleep(1)
    assert _live_groups() == []
