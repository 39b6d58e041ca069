"""Kill a sweep after its first trial finished, resume it, and check nothing finished runs twice."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from _faults import assert_says
from tests._platform import children, read_sweep, write_space
from tests._processes import process_tree
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[1]


# Enough examples that a trial stopped at ASHA's first rung (2 checks = 1 epoch) still trains for
# seconds: the test must catch the sweep between its first finished trial and its last.
SIZES = {"train": 1600, "valid": 64, "test": 64}
SETS = (*TINY_SETS, "train.check_every=50", "train.max_epochs=3")


def _command(tiny: Path, workdir: Path, space: Path, *extra: str) -> list[str]:
    sets = [arg for s in SETS for arg in ("--set", s)]
    return [sys.executable, "-m", "iaa.cli", "tune", "--dataset", "cbt-ne", "--data", str(tiny), "--num-samples", "3",
            "--max-concurrent", "1", "--search-space", str(space), *sets, "--workdir", str(workdir), "--name", "r",
            "--json", *extra]


def _finished_children(workdir: Path) -> list:
    sweep_file = workdir / "sweeps" / "r" / "sweep.json"
    if not sweep_file.is_file():
        return []
    try:
        return [r for r in children(read_sweep(workdir, "r")) if r.info.status == "FINISHED"]
    except Exception:  # noqa: BLE001 - the store is being written
        return []


@dataclass(frozen=True)
class Killed:
    """A sweep killed (the CLI and its Ray, SIGKILL) after its first trial finished (and before the last)."""

    tiny: Path
    space: Path
    work: Path
    env: dict[str, str]
    done_before: dict[str, Any]
    checks_before: dict[str, int]
    record: dict[str, Any]                    # sweep.json as the killed process left it


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    tmp_path = tmp_path_factory.mktemp("killed")
    tiny = make_tiny_prepared(tmp_path / "data", SIZES)
    space = write_space(tmp_path)
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(_command(tiny, work, space), cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    try:
        # once the record kept as the trials run holds the first one's end (a few seconds after it,
        # while the next one trains), or else once a second one ended
        while not _recorded_finished(work) and len(_finished_children(work)) < 2:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.time() < deadline, "no trial finished in time"
            time.sleep(0.25)
    finally:
        started = process_tree(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)   # the whole session: the CLI and the Ray it started,
        for pid in started:                   # and the Ray processes that left it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    while process_tree(proc.pid) - {proc.pid} or any(Path(f"/proc/{pid}").exists() for pid in started - {proc.pid}):
        time.sleep(0.1)                       # nothing of the killed sweep writes to its folder any more
    done_before = {r.data.tags["trial_id"]: r for r in _finished_children(work)}
    assert 1 <= len(done_before) < 3, "the sweep must be killed part-way"
    client = MlflowClient(read_sweep(work, "r")["tracking_uri"])
    checks_before = {t: len(client.get_metric_history(r.info.run_id, "valid_acc")) for t, r in done_before.items()}
    return Killed(tiny, space, work, env, done_before, checks_before, read_sweep(work, "r"))


def _recorded_finished(work: Path) -> bool:
    with contextlib.suppress(Exception):      # not written yet, or a version without the record's keys
        return any(t["status"] == "TERMINATED" for t in read_sweep(work, "r")["trials"])
    return False


def test_a_killed_sweeps_record_holds_the_trials_and_time_of_its_run(killed: Killed) -> None:
    """The process was killed, so it wrote nothing as it died: its record is the one it kept as
    its trials ran. ``report --sweeps`` lists the sweep as interrupted, with its finished trial."""
    from iaa.jobs.reports import sweep_list
    from iaa.jobs.sweeps.record import SweepRecord

    finished = {t["trial_id"]: t for t in killed.record["trials"] if t["status"] == "TERMINATED"}
    assert finished and set(finished) <= set(killed.done_before)
    for trial_id, row in finished.items():
        assert row["mlflow_run_id"] == killed.done_before[trial_id].info.run_id
        assert row["best_valid_acc"] == killed.done_before[trial_id].data.metrics["best_valid_acc"]
        assert row["checks"] == killed.checks_before[trial_id] and row["stop_reason"]
        assert Path(row["checkpoint"]).is_file()
    [(_, seconds)] = killed.record["spans"]
    assert seconds > 0 and killed.record["wall_s"] > 0
    summary = sweep_list.summary(SweepRecord.from_json(killed.record), killed.work / "sweeps" / "r", {})
    assert (summary.state, summary.ended, summary.best_trial) == (
        "interrupted", len(finished), min(finished.values(), key=lambda t: -t["best_valid_acc"])["name"])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_copied_folder_resumed_with_more_trials_runs_them_all_in_its_own_stores(killed: Killed,
                                                                                 tmp_path: Path) -> None:
    """``--num-samples 4`` on the resume of a 3-trial sweep, in a copy of its work folder: Tune
    restores its run saved with 3 trials to make and makes the 4th too; the finished trials are
    kept; Optuna says nothing in its own format on the way; every run, artifact and trial goes to
    the copy's stores, and the original stays as it was."""
    import optuna

    copy = tmp_path / "more"
    subprocess.run(["cp", "-a", str(killed.work), str(copy)], check=True)
    assert len(read_sweep(copy, "r")["trials"]) < 3, "the copy must be the stopped sweep's (this test runs first)"
    before = _snapshot(killed.work)
    command = _command(killed.tiny, copy, killed.space, "--resume")
    command[command.index("--num-samples") + 1] = "4"
    more = subprocess.run(command, cwd=tmp_path, env=killed.env, capture_output=True, text=True, timeout=800)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert json.loads(more.stdout.strip().splitlines()[-1])["trials"] == 4
    after = _snapshot(killed.work)
    assert sorted(after) == sorted(before) and [k for k in before if before[k] != after[k]] == [], \
        "resuming the copy changed the original"
    sweep = read_sweep(copy, "r")
    assert sweep["num_samples"] == 4 and len(sweep["trials"]) == 4
    assert {t["status"] for t in sweep["trials"]} == {"TERMINATED"}
    assert sweep["tracking_uri"] == f"sqlite:///{(copy / 'mlflow.db').resolve()}"
    runs = {r.data.tags["trial_id"]: r for r in children(sweep) if r.info.status == "FINISHED"}
    assert sorted(r.info.run_id for r in runs.values()) == sorted(t["mlflow_run_id"] for t in sweep["trials"])
    assert all(r.info.artifact_uri.removeprefix("file://").startswith(str(copy.resolve())) for r in runs.values())
    assert {t: runs[t].info.end_time for t in killed.done_before} == {
        t: r.info.end_time for t, r in killed.done_before.items()}, "a finished trial ran again"
    assert "Using an existing study" not in more.stderr and "[I 20" not in more.stderr
    study = optuna.load_study(study_name=sweep["optuna"]["study"], storage=f"sqlite:///{copy / 'optuna.db'}")
    ended = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(ended) == 4 and not [t for t in study.trials if t.state.name == "RUNNING"]


def test_a_trial_whose_last_checkpoint_was_deleted_before_the_state_was_saved_resumes_from_an_older_one(
        killed: Killed, tmp_path: Path) -> None:
    """Tune deletes a trial's superseded checkpoint when the next arrives, and saves the sweep's
    state a moment later: a kill in between leaves a state that names a deleted checkpoint. Here
    the killed trial's named checkpoint is deleted, in a copy of the work folder, with an older
    one beside it (Tune keeps the trial's best). The resume says so, continues the trial from the
    older one, and every trial ends TERMINATED with each of its checks logged once."""
    import shutil

    import ray.tune as tune

    copy = tmp_path / "lost"
    subprocess.run(["cp", "-a", str(killed.work), str(copy)], check=True)
    running = [t for t in tune.ExperimentAnalysis(str(copy / "ray" / "r")).trials
               if t.status != "TERMINATED" and t.checkpoint is not None]
    named = Path(running[0].checkpoint.path) if running else None
    assert named is None or copy in named.parents, named
    if named is None or named.name == "checkpoint_000000":
        pytest.skip("the sweep was killed before its running trial made two checks")
    older = named.with_name("checkpoint_000000")
    if not older.exists():                         # as the trial's best, kept by Tune
        shutil.copytree(named, older)
    shutil.rmtree(named)
    resumed = subprocess.run(_command(killed.tiny, copy, killed.space, "--resume"), cwd=tmp_path, env=killed.env,
                             capture_output=True, text=True, timeout=800)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_says(resumed.stderr, f"Tune trial {running[0].trial_id}", "deleted as the sweep was stopped")
    sweep = read_sweep(copy, "r")
    assert {t["status"] for t in sweep["trials"]} == {"TERMINATED"}, sweep["trials"]
    client = MlflowClient(sweep["tracking_uri"])
    for run in children(sweep):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "valid_acc")]
        assert len(steps) == len(set(steps)), (run.data.tags["trial_id"], steps)


def test_killed_sweep_resumes_without_rerunning_finished_trials(killed: Killed, tmp_path: Path) -> None:
    tiny, work, space, env = killed.tiny, killed.work, killed.space, killed.env
    done_before, checks_before = killed.done_before, killed.checks_before
    client = MlflowClient(read_sweep(work, "r")["tracking_uri"])
    resumed = subprocess.run(_command(tiny, work, space, "--resume"), cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=800)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["sweep"] == "r"

    sweep = read_sweep(work, "r")
    assert len(sweep["trials"]) == 3 and {t["status"] for t in sweep["trials"]} == {"TERMINATED"}
    assert set(done_before) <= {t["trial_id"] for t in sweep["trials"]}
    runs = children(sweep)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert sorted(r.info.run_id for r in finished) == sorted(t["mlflow_run_id"] for t in sweep["trials"]), \
        "one child run per trial: resumed trials find theirs again"
    # a trial started after Tune's last saved state is forgotten and replaced; its run is closed
    assert all(r.info.status == "KILLED" and not r.data.metrics for r in runs if r not in finished)
    for trial_id, before in done_before.items():
        after = next(r for r in runs if r.data.tags["trial_id"] == trial_id)
        assert after.info.end_time == before.info.end_time, f"finished trial {trial_id} ran again"
        steps = [m.step for m in client.get_metric_history(after.info.run_id, "valid_acc")]
        assert len(steps) == len(set(steps)) == checks_before[trial_id]
    assert client.get_run(sweep["parent_run_id"]).info.status == "FINISHED"


def test_a_finished_sweep_resumes_at_once_with_nothing_left_and_its_folder_as_it_was(
        killed: Killed, tmp_path: Path) -> None:
    """After the resume above the sweep is finished: resuming it again starts no Ray and writes nothing."""
    tiny, work, space, env = killed.tiny, killed.work, killed.space, killed.env
    if {t["status"] for t in read_sweep(work, "r")["trials"]} != {"TERMINATED"}:
        first = subprocess.run(_command(tiny, work, space, "--resume"), cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=800)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    folder, ray_files = _snapshot(work / "sweeps" / "r"), _snapshot(work / "ray")
    again = subprocess.run([sys.executable, "-m", "iaa.cli", "tune", "--resume", "r", "--workdir", str(work), "--json"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "nothing left to run" in again.stderr and "3 of 3 trials" in again.stderr
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["sweep"] == "r" and result["trials"] == 3 and result["nothing_left"] is True
    assert _snapshot(work / "sweeps" / "r") == folder, "the sweep's folder changed"
    assert _snapshot(work / "ray") == ray_files and "Ray" not in again.stderr.replace("local Ray cluster", "")

