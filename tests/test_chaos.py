"""Worker nodes die hard under a sweep, a training run and a served model, and nothing is lost.

One cluster for the module (:class:`tests._chaos.ChaosCluster`: a head with no CPUs, two one-CPU
worker nodes); its nodes are killed without a graceful stop and replaced by fresh ones. The sweep
and train tests fail with restores switched off (``IAA_MAX_FAILURES=0``: the killed trial ends
ERROR, the Train run fails); see docs/platform.md, "Node failures".
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from _faults import assert_says
from tests._chaos import ChaosCluster, chaos_launcher, held, hold_at, kill_when_held, wait_for
from tests._platform import children, read_sweep, write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow]

CHECKS = 6          # TINY_SETS: 2 epochs of 12 batches, a check every 4 batches


@pytest.fixture(scope="module")
def chaos():
    cluster = ChaosCluster(workers=2)
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("data"))


@pytest.mark.timeout(60)
def test_ray_prints_cluster_lines_from_the_thread_the_sweep_diverts(chaos: ChaosCluster) -> None:
    """The driver thread whose lines (a dead raylet's dump) go to the sweep's log, not the console,
    still has the name iaa looks for (iaa/platform/cluster/driver_lines.py)."""
    import threading

    from iaa.platform.cluster.ray_internals import ERROR_LISTENER_THREAD

    assert ERROR_LISTENER_THREAD in {t.name for t in threading.enumerate()}


def _sweep(chaos: ChaosCluster, tiny: Path, root: Path, name: str, markers: Path, show: bool,
           resume: bool = False, verbose: bool = False) -> Any:
    from iaa.cli.adapters import open_tracker
    from iaa.jobs.tune import tune

    root.mkdir(parents=True, exist_ok=True)
    markers.mkdir(exist_ok=True)
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=4, search_space=write_space(root), sets=TINY_SETS,
                           workdir=root / "work", name=name, resume=resume, storage_path=str(root / "shared"),
                           grace_period=CHECKS, show_progress=show, verbose=verbose)   # no ASHA stop: the same trials every run
    return tune.run(req, open_tracker, chaos_launcher(chaos.address, str(root / "shared"), markers))


def sweep_history(sweep: dict[str, Any], searched: tuple[str, ...] = ("model.hidden_dim", "model.steps")) -> dict[str, Any]:
    """Per configuration (its ``searched`` values): the child run, its valid_acc by step, and the
    steps as logged (repeats kept)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sweep["tracking_uri"])
    out = {}
    for run in children(sweep):
        key = tuple(run.data.params[k] for k in searched)
        history = client.get_metric_history(run.info.run_id, "valid_acc")
        out[key] = {"run": run, "steps": [m.step for m in history],
                    "valid_acc": {m.step: m.value for m in sorted(history, key=lambda m: m.step)}}
    return out


def _parent(sweep: dict[str, Any]) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(sweep["tracking_uri"]).get_run(sweep["parent_run_id"])


def study_trials(root: Path, name: str) -> list[Any]:
    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{root / 'work' / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


@pytest.mark.timeout(420)
def test_sweep_survives_node_kills(chaos: ChaosCluster, tiny: Path, tmp_path: Path, capfd, console) -> None:
    _sweep(chaos, tiny, tmp_path / "clean", "clean", tmp_path / "clean-marks", show=False)
    capfd.readouterr()
    expected = sweep_history(read_sweep(tmp_path / "clean" / "work", "clean"))

    markers = tmp_path / "chaos-marks"
    markers.mkdir()
    import threading

    outcome: dict[str, Any] = {}

    def inject() -> None:
        try:                                  # 1: a node dies while its trial writes check 2's checkpoint
            writing = wait_for(lambda: held(markers, 2), 240)
            chaos.kill(writing.node_id, replace=False, reason=f"{writing.trial_id} writing check {writing.check}")
            chaos.restore_workers()           # the spot replacement
            late = wait_for(lambda: held(markers, 4), 240)   # 2: a node dies mid-trial, after check 4
            chaos.kill(late.node_id, replace=False, reason=f"{late.trial_id} after check {late.check}")
            chaos.restore_workers()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            outcome["error"] = err

    hold_at(markers, 2, "writing")
    hold_at(markers, 4, "after")
    killer = threading.Thread(target=inject, daemon=True)
    killer.start()
    started = time.monotonic()
    _sweep(chaos, tiny, tmp_path / "chaos", "chaos", markers, show=True)
    wall = time.monotonic() - started
    killer.join(timeout=5)
    console = capfd.readouterr().err
    (tmp_path / "console.txt").write_text(console, encoding="utf-8")
    assert "error" not in outcome, outcome
    assert len(chaos.kills) >= 2, chaos.kills

    sweep = read_sweep(tmp_path / "chaos" / "work", "chaos")
    assert sorted(t["status"] for t in sweep["trials"]) == ["TERMINATED"] * 4, [t["status"] for t in sweep["trials"]]
    got = sweep_history(sweep)
    assert set(got) == set(expected) and len(children(sweep)) == 4            # one child run per trial
    for key, run in got.items():
        assert run["run"].info.status == "FINISHED", (key, run["run"].info.status)
        assert len(run["steps"]) == len(set(run["steps"])) == CHECKS, (key, run["steps"])   # no step twice
        assert run["valid_acc"] == expected[key]["valid_acc"], key       # exactly the fault-free run's checks
    restores = {key: int(run["run"].data.tags.get("restores", -1)) for key, run in got.items()}
    assert sum(restores.values()) >= 2 and min(restores.values()) >= 0, restores

    trials = study_trials(tmp_path / "chaos", "chaos")
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials), [t.state for t in trials]
    for t in trials:
        key = (str(t.params["model.hidden_dim"]), str(t.params["model.steps"]))
        assert sorted(t.intermediate_values) == list(range(1, CHECKS + 1)), t.intermediate_values
        assert list(t.intermediate_values.values()) == [got[key]["valid_acc"][s] for s in sorted(got[key]["valid_acc"])]

    assert len(re.findall(r"node \S+ .*lost", console)) == len(chaos.kills), console
    assert len(re.findall(r"trial-\d+ restored from check \d+", console)) == sum(restores.values()), console
    assert "[state-dump]" not in console and "(raylet)" not in console, console
    assert re.search(r"\d+ trials? restored", console), console
    print(f"chaos sweep: {wall:.0f}s, kills {chaos.kills}")


def _kill_after_check_2(chaos: ChaosCluster, tmp_path: Path, what: str) -> tuple[Path, Any, dict[str, Any]]:
    """Fresh worker nodes, and in the background a kill of the node whose worker holds after
    check 2; returns the markers' folder, the killing thread and where its failure is kept."""
    chaos.restore_workers()
    markers = tmp_path / "chaos-marks"
    markers.mkdir()
    hold_at(markers, 2, "after")
    killer, outcome = kill_when_held(chaos, markers, 2, what, timeout_s=240)
    return markers, killer, outcome


@pytest.mark.timeout(420)
def test_a_trial_out_of_restores_fails_alone_and_the_resume_runs_it_again_under_its_name(
        chaos: ChaosCluster, tiny: Path, tmp_path: Path, capfd, console, monkeypatch) -> None:
    """With no restores left, a trial whose node dies ends ERROR (``worker-lost``) and the sweep
    finishes with the others, saying so and naming the resume; the resume runs that trial again
    from its last check under its own name and run, and leaves nothing else to run. The loss is
    said twice in all: one line naming the node as the trial ends (none for the node alone, and
    none of Tune's, whose log reaches the console here), and the closing note."""
    markers, killer, outcome = _kill_after_check_2(chaos, tmp_path, "sweep")
    monkeypatch.setenv("IAA_MAX_FAILURES", "0")
    tune_log, heard = logging.getLogger("ray.tune"), []
    handler = logging.Handler()
    handler.emit = heard.append             # Tune's log, which Ray's own handler shows on the console when `verbose`
    tune_log.addHandler(handler)
    try:
        _sweep(chaos, tiny, tmp_path / "s", "s", markers, show=True, verbose=True)
    finally:
        tune_log.removeHandler(handler)
    killer.join(timeout=5)
    shown = capfd.readouterr().err
    (tmp_path / "console.txt").write_text(shown, encoding="utf-8")
    assert "error" not in outcome, outcome
    first = read_sweep(tmp_path / "s" / "work", "s")
    lost = [t for t in first["trials"] if t["status"] == "ERROR"]
    assert len(lost) == 1 and lost[0]["stop_reason"] == "worker-lost" and lost[0]["checks"] == 2, first["trials"]
    assert sorted(t["status"] for t in first["trials"]) == ["ERROR"] + ["TERMINATED"] * 3
    name = lost[0]["name"]
    [run] = [r for r in children(first) if r.data.tags["trial_id"] == lost[0]["trial_id"]]
    assert run.info.status == "FAILED" and run.data.tags["stop_reason"] == "worker-lost", run
    assert not [k for k in _parent(first).data.params if k.startswith("best.")]   # params wait: they never change
    assert re.search(rf"{name} failed after 2 checks, .*no restores left", shown), shown
    assert re.search(rf"1 trial\(s\) lost a worker with no restores left .*\({name}\); .*`resume` s", shown), shown
    said = [line for line in shown.splitlines() if re.search(r"\blost\b|\bdied\b|\bfailed\b|did not complete", line)]
    said += [r.getMessage() for r in heard if lost[0]["trial_id"] in r.getMessage()]   # by Tune's own id
    assert len(said) == 2, said
    assert_says(said[0], f"{name} failed", f"node {chaos.kills[-1].node_id[:8]} ", "no restores left")
    assert "Traceback" not in shown and "interrupted" not in shown, shown

    monkeypatch.setenv("IAA_MAX_FAILURES", "2")
    chaos.restore_workers()
    _sweep(chaos, tiny, tmp_path / "s", "s", tmp_path / "resume-marks", show=True, resume=True)
    shown = capfd.readouterr().err
    assert_says(shown, "3 of 4 trials finished", "1 left", "1 continue")
    assert re.search(rf"{name} check 3 ", shown) and not re.search(r"trial-\d+ check [12] ", shown), shown
    sweep = read_sweep(tmp_path / "s" / "work", "s")
    assert sorted(t["status"] for t in sweep["trials"]) == ["TERMINATED"] * 4, sweep["trials"]
    assert {t["trial_id"]: t["name"] for t in sweep["trials"]} == {t["trial_id"]: t["name"] for t in first["trials"]}
    history = sweep_history(sweep)
    assert len(children(sweep)) == 4 and all(r["run"].info.status == "FINISHED" for r in history.values())
    assert all(len(r["steps"]) == len(set(r["steps"])) == CHECKS for r in history.values()), history
    trials = study_trials(tmp_path / "s", "s")
    assert sorted(t.state.name for t in trials if t.state.name != "FAIL") == ["COMPLETE"] * 4, trials
    parent = _parent(sweep)
    best = parent.data.tags["best_mlflow_run_id"]
    assert [r.info.run_id for r in children(sweep) if r.data.tags.get("best_in_sweep") == "true"] == [best]
    assert parent.data.params["best.trial_id"] == parent.data.tags["best_trial_id"]
    _sweep(chaos, tiny, tmp_path / "s", "s", tmp_path / "resume-marks", show=True, resume=True)
    assert "nothing left to run" in capfd.readouterr().err


def train_on_chaos(chaos: ChaosCluster, tiny: Path, root: Path, markers: Path, show: bool = False,
           resume: bool = False) -> Any:
    from iaa.cli.adapters import open_tracker
    from iaa.jobs.train import train

    markers.mkdir(exist_ok=True)
    req = train.TrainRequest(dataset=None, data=tiny, sets=TINY_SETS, run_dir=root / "run", workers=2, resume=resume,
                             storage_path=str(root / "shared"), workdir=root / "work", show_progress=show)
    return train.run_request(req, open_tracker, chaos_launcher(chaos.address, str(root / "shared"), markers))


@pytest.fixture(scope="module")
def clean_train(chaos: ChaosCluster, tiny: Path, tmp_path_factory) -> tuple[Any, Path]:
    """A ``train --workers 2`` run that no kill touched, and its run folder."""
    chaos.restore_workers()
    root = tmp_path_factory.mktemp("clean-train")
    return train_on_chaos(chaos, tiny, root, root / "marks"), root / "run"


def _assert_same_run(result: Any, run_dir: Path, clean_train: tuple[Any, Path]) -> None:
    """The run ended as the clean run did, with its weights, each of its 3 checks logged once."""
    from iaa.jobs.modeling import checkpoint

    clean, clean_dir = clean_train
    assert result.steps == clean.steps and result.best_valid_acc == clean.best_valid_acc
    a = checkpoint.load(clean_dir / "checkpoints" / "last.pt")["model"]
    b = checkpoint.load(run_dir / "checkpoints" / "last.pt")["model"]
    assert a.keys() == b.keys() and all(torch_equal(a[k], b[k]) for k in a)     # the uninterrupted run's weights
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["checks"] for r in rows] == list(range(1, 4)), [r["checks"] for r in rows]   # none twice
    # 2 workers: 6 batches each per epoch, a check every 4: 3 checks, the node dies after the 2nd


@pytest.mark.timeout(300)
def test_train_on_two_workers_survives_a_node_kill(chaos: ChaosCluster, tiny: Path, tmp_path: Path, capfd, console,
                                                   clean_train: tuple[Any, Path]) -> None:
    kills_before = len(chaos.kills)
    markers, killer, outcome = _kill_after_check_2(chaos, tmp_path, "train")   # mid-epoch 1 of 2
    started = time.monotonic()
    result = train_on_chaos(chaos, tiny, tmp_path / "chaos", markers, show=True)
    wall = time.monotonic() - started
    killer.join(timeout=5)
    shown = capfd.readouterr()
    assert "error" not in outcome, outcome
    assert len(chaos.kills) == kills_before + 1
    assert "[state-dump]" not in shown.out + shown.err and "(raylet)" not in shown.out + shown.err, shown
    _assert_same_run(result, tmp_path / "chaos" / "run", clean_train)
    restores = re.findall(r"the run lost a worker .*; restore 1 of 2: it continues from check [12] once the cluster has room", shown.err)
    assert len(restores) == 1, shown.err
    print(f"train --workers 2 with a node kill: {wall:.0f}s")

    # a node lost after the run (as a command ends): Ray's notice of it still reaches no stream
    import ray

    lost = chaos.kill(replace=False, reason="after the run").node_id
    wait_for(lambda: not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == lost), 30)
    time.sleep(2)                                         # the notice follows the GCS's verdict
    after = capfd.readouterr()
    assert "marked dead" not in after.out + after.err and "(raylet)" not in after.out + after.err, after


@pytest.mark.timeout(300)
def test_train_out_of_restores_is_one_error_naming_the_resume_that_continues_it(
        chaos: ChaosCluster, tiny: Path, tmp_path: Path, monkeypatch, clean_train: tuple[Any, Path]) -> None:
    """With no restores left a lost node fails the run with one expected error (no Ray traceback on
    the console), the run folder keeps what resuming needs, and the command it names continues
    from the last check to the clean run's weights."""
    from iaa.jobs.ports import RestoresSpent

    markers, killer, outcome = _kill_after_check_2(chaos, tmp_path, "train")
    monkeypatch.setenv("IAA_MAX_FAILURES", "0")
    with pytest.raises(RestoresSpent) as caught:
        train_on_chaos(chaos, tiny, tmp_path / "chaos", markers)
    killer.join(timeout=5)
    assert "error" not in outcome, outcome
    assert_says(caught.value, "lost a worker", "after 0 restore(s)", "`resume`", tmp_path / "chaos" / "run")

    run_dir = tmp_path / "chaos" / "run"
    ray_run = (run_dir / "ray_run_name").read_text()
    monkeypatch.setenv("IAA_MAX_FAILURES", "2")
    chaos.restore_workers()
    resumed_at = time.time()
    result = train_on_chaos(chaos, tiny, tmp_path / "chaos", tmp_path / "resume-marks", resume=True)
    _assert_same_run(result, run_dir, clean_train)
    assert (run_dir / "ray_run_name").read_text() == ray_run           # the same Ray Train run continued ...
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["time"] < resumed_at                                   # ... from a check it made before


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


def closed_loop(url: str, body: bytes, clients: int, total: int, seconds: float, stats: dict[str, Any]) -> None:
    """``clients`` loopback clients, each sending its next request when the last is answered, until
    ``total`` requests or ``seconds`` passed; every answer's status and latency go to ``stats``."""
    import threading
    import urllib.error
    import urllib.request
    from collections import Counter

    deadline, lock = time.monotonic() + seconds, threading.Lock()

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                if stats["sent"] >= total:
                    return
                stats["sent"] += 1
            started = time.monotonic()
            request = urllib.request.Request(f"{url}/predict", data=body, headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    status, text = reply.status, reply.read()
            except urllib.error.HTTPError as err:
                status, text = err.code, err.read()
            except OSError as err:
                status, text = 0, str(err).encode()
            with lock:
                stats["latency"].append(time.monotonic() - started)
                stats["status"].append(status)
                if b"Traceback" in text:
                    stats["tracebacks"] += 1
                if status != 200:
                    stats.setdefault("bodies", Counter())[(status, text[:200].decode(errors="replace"))] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.timeout(300)
def test_serve_two_replicas_answer_through_a_node_kill(chaos: ChaosCluster, tmp_path: Path) -> None:
    import threading
    from collections import Counter

    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve as platform_serve
    from tests._explain import tiny_setup
    from tests.test_serve import QUESTION, free_port, wait_ready

    chaos.restore_workers()
    prepared, ckpts = tiny_setup(tmp_path)
    cfg = job.config(model_uri=None, checkpoint=ckpts["iaa"], ensemble_dir=None, data_dir=prepared,
                     workdir=tmp_path, tracking_uri=None, replicas=2, max_batch=4, port=free_port(),
                     address=chaos.address)
    url = platform_serve.start(cfg, job.CODE)
    try:
        wait_ready(url, 120)
        stats: dict[str, Any] = {"sent": 0, "status": [], "latency": [], "tracebacks": 0}
        load = threading.Thread(target=closed_loop, args=(url, json.dumps(QUESTION).encode(), 4, 600, 120, stats))
        load.start()
        wait_for(lambda: len(stats["status"]) >= 100, 60)
        kill = chaos.kill(replace=False, reason="serve")
        chaos.restore_workers()
        back = wait_for(lambda: platform_serve.replicas(cfg.app_name) == {"RUNNING": 2}, 120, poll_s=0.5)
        back_s = time.monotonic() - kill.at
        load.join(timeout=150)
    finally:
        platform_serve.stop(cfg.app_name)
    answered = sum(s == 200 for s in stats["status"]) / len(stats["status"])
    latency = sorted(stats["latency"])
    p50, p99 = latency[len(latency) // 2], latency[int(len(latency) * 0.99) - 1]
    errors = Counter(s for s in stats["status"] if s != 200)
    print(f"serve through a node kill: {len(latency)} requests, {answered:.2%} answered, errors {dict(errors)}, "
          f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, two replicas again {back_s:.1f} s after the kill; "
          f"refusals {dict(stats.get('bodies', {}))}")
    assert back and stats["tracebacks"] == 0, stats.get("bodies")      # no 500 with a traceback
    # Requests on the killed node are lost (Serve's proxy answers them a bare 500 "Internal Server
    # Error", or the connection resets) until Serve sees the node gone: not only those in flight.
    # Seen over 600 requests: 2, 5, 8 and 29 lost (99.7% to 95.2% answered); the 99% goal is not
    # met every time, so this bound is the service staying up, not the goal.
    assert answered >= 0.9, (answered, dict(errors), stats.get("bodies"))
