"""What a sweep's console says when nodes die (no Ray): one line per lost node and per restored
trial, and what the restores cost in the summary line. The cluster side is tests/test_chaos.py."""

from __future__ import annotations

import io

from _faults import assert_says


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lost_nodes_and_restored_trials_are_one_line_each_and_the_summary_counts_the_work_redone() -> None:
    from iaa.jobs.sweeps.console import SweepConsole

    out, clock = io.StringIO(), _Clock()
    console = SweepConsole(None, ["model.steps"], say=lambda line: print(line, file=out), clock=clock)
    console.trial_started("trial-0000", {"model.steps": 1})
    console.trial_started("trial-0001", {"model.steps": 2})
    clock.now = 10.0
    console.trial_checked("trial-0000", {"checks": 1, "epoch": 0.3, "valid_acc": 0.2})
    clock.now = 14.0
    console.node_lost("2c3a5429 (10.0.0.7)", "its trials restart from their last checkpoints")
    console.trial_restored("trial-0000", 1)        # 4 s after its last check
    console.trial_restored("trial-0001", 0)        # 14 s after its start, before any check
    console.trial_started("trial-0000", {"model.steps": 1})    # Tune starts it again: not a new trial
    clock.now = 20.0
    console.trial_checked("trial-0000", {"checks": 2, "epoch": 0.6, "valid_acc": 0.3})
    lines = out.getvalue().splitlines()
    assert lines[3:6] == ["[0m14s] node 2c3a5429 (10.0.0.7) lost: its trials restart from their last checkpoints",
                          "[0m14s] trial-0000 restored from check 1, restore 1; it goes on once the cluster "
                          "has room for it",
                          "[0m14s] trial-0001 restored from check 0 (the start), restore 1; it goes on once the "
                          "cluster has room for it"]
    assert len(lines) == 7
    assert console.summary(60.0) == ("sweep took 1m00s; 2 trials restored (2 restores after 1 lost node); "
                                     "work redone: at most 0m18s of training since their last checkpoints")


def test_a_sweep_without_restores_says_nothing_of_them() -> None:
    from iaa.jobs.sweeps.console import SweepConsole

    console = SweepConsole(None, [], say=lambda line: None, clock=_Clock())
    assert console.restores() is None and console.summary(5.0) == "sweep took 0m05s"


def test_a_lost_node_is_said_once_with_what_becomes_of_its_trials(monkeypatch) -> None:
    import ray

    from iaa.platform.sweeps.trials.trial_events import NodeWatch

    class Heard:
        def __init__(self) -> None:
            self.lost: list[tuple[str, str]] = []

        def node_lost(self, node: str, detail: str = "") -> None:
            self.lost.append((node, detail))

    nodes = [{"NodeID": "aaaaaaaa11", "NodeManagerAddress": "10.0.0.1", "Alive": True},
             {"NodeID": "bbbbbbbb22", "NodeManagerAddress": "10.0.0.2", "Alive": True}]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    for restores, then in (("", "its trials restart from their last checkpoints"),
                           ("0", "restores are off (IAA_MAX_FAILURES=0): its trials end")):
        monkeypatch.setenv("IAA_MAX_FAILURES", restores)
        watch, heard = NodeWatch(), Heard()
        nodes[1]["Alive"] = True
        watch.tell(heard, now=True)
        nodes[1]["Alive"] = False
        watch.tell(heard, now=True)
        watch.tell(heard, now=True)                                  # said once
        assert heard.lost == [("bbbbbbbb (10.0.0.2)", then)]


def test_a_node_whose_trial_lost_its_worker_is_named_in_that_trials_line_alone(monkeypatch) -> None:
    """With no restores left, the trial's failure names the node that died with it (by the id in
    its error, where Ray gives one), and the node has no line of its own; a node that no failure
    names is told once ``NODE_CLAIM_S`` has passed."""
    import ray

    from iaa.platform.sweeps.trials import trial_events
    from iaa.platform.sweeps.trials.trial_events import NodeWatch, lost_worker_text

    class Heard:
        def __init__(self) -> None:
            self.lost: list[str] = []

        def node_lost(self, node: str, detail: str = "") -> None:
            self.lost.append(node)

    nodes = [{"NodeID": f"{c * 8}{i}", "NodeManagerAddress": f"10.0.0.{i}", "Alive": True}
             for i, c in ((1, "a"), (2, "b"), (3, "c"))]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setenv("IAA_MAX_FAILURES", "0")
    monkeypatch.setattr(trial_events, "NODE_POLL_S", 0.0)
    watch, heard = NodeWatch(), Heard()
    watch.tell(heard)
    nodes[1]["Alive"] = nodes[2]["Alive"] = False
    watch.tell(heard)                                              # seen dead by a poll before the failures
    assert heard.lost == []
    first = watch.claim("The actor died because its node has died. Node Id: bbbbbbbb2")
    second = watch.claim("The actor is dead")                      # no id: the nodes seen dead lately
    assert first == ["bbbbbbbb (10.0.0.2)"] and second == ["bbbbbbbb (10.0.0.2)", "cccccccc (10.0.0.3)"]
    assert_says(lost_worker_text(first), "(node bbbbbbbb (10.0.0.2) died)", "no restores left")
    assert_says(lost_worker_text(()), "(its process or node died)", "no restores left")
    monkeypatch.setattr(trial_events, "NODE_CLAIM_S", 0.0)
    nodes[0]["Alive"] = False
    watch.tell(heard)
    watch.tell(heard, now=True)
    assert heard.lost == ["aaaaaaaa (10.0.0.1)"]                  # claimed nodes are never told


def test_tunes_records_of_a_lost_worker_reach_the_sweeps_log_file_and_not_the_console(tmp_path) -> None:
    """Tune's failure record and its "did not complete" record of trials that lost their worker go
    to a file handler on ``ray.tune`` (the sweep's log) and not to Ray's console handler; those of
    any other error still reach the console."""
    import logging

    from ray.exceptions import RayActorError

    from iaa.platform.sweeps.trials.lost_trials import END_LOGGER, keep_tune_records_off_the_console
    from iaa.platform.sweeps.trials.full_disk import TRIAL_LOGGER

    class Trial:
        pickled_error_file = error_file = None

        def __init__(self, trial_id: str, error: BaseException) -> None:
            self.trial_id, self.error = trial_id, error

        def get_pickled_error(self) -> BaseException:
            return self.error

        def get_error(self) -> None:
            return None

        def __repr__(self) -> str:
            return f"run_trial_{self.trial_id}"

    shown, kept = io.StringIO(), tmp_path / "tune.log"
    console_handler, log_file = logging.StreamHandler(shown), logging.FileHandler(kept, encoding="utf-8")
    ray_logger, tune_logger = logging.getLogger("ray"), logging.getLogger("ray.tune")
    ray_logger.addHandler(console_handler)
    tune_logger.addHandler(log_file)
    try:
        keep_tune_records_off_the_console()
        lost, raised = RayActorError(error_msg="The actor died because its node has died."), ValueError("bad value")
        logging.getLogger(TRIAL_LOGGER).error("Trial task failed for trial run_trial_a", exc_info=lost)
        logging.getLogger(END_LOGGER).error("Trials did not complete: %s", [Trial("a", lost)])
        logging.getLogger(TRIAL_LOGGER).error("Trial task failed for trial run_trial_b", exc_info=raised)
        logging.getLogger(END_LOGGER).error("Trials did not complete: %s", [Trial("a", lost), Trial("b", raised)])
    finally:
        ray_logger.removeHandler(console_handler)
        tune_logger.removeHandler(log_file)
        log_file.close()
    on_console, in_file = shown.getvalue(), kept.read_text(encoding="utf-8")
    assert "run_trial_a" not in on_console.replace("[run_trial_a, run_trial_b]", ""), on_console
    assert_says(on_console, "Trial task failed for trial run_trial_b", "bad value", "[run_trial_a, run_trial_b]")
    assert_says(in_file, "Trial task failed for trial run_trial_a", "its node has died", "Trials did not complete: [run_trial_a]")


def test_a_resumed_trial_restored_from_a_checkpoint_continues_on_the_console() -> None:
    from dataclasses import dataclass, field

    from iaa.jobs.sweeps.console import SweepConsole
    from iaa.platform.sweeps.driver_side import DriverSide, bound
    from iaa.platform.sweeps.trials.trial_events import ConsoleCallback

    @dataclass
    class Trial:
        trial_id: str
        config: dict
        last_result: dict = field(default_factory=dict)
        checkpoint: object = None

    out, clock = io.StringIO(), _Clock()
    console = SweepConsole(None, ["model.steps"], say=lambda line: print(line, file=out), clock=clock)
    side = DriverSide(tracker=None, experiment="e", parent_run_id=None, dataset="d", spec=None,  # type: ignore[arg-type]
                      console=console, names={"a": "trial-0001", "b": "trial-0002"})
    with bound("s", side):
        callback = ConsoleCallback("s")
        callback.on_trial_start(0, [], Trial("a", {"model.steps": 2}, {"checks": 2}, checkpoint="ckpt"))
        callback.on_trial_start(0, [], Trial("b", {"model.steps": 1}))          # never started before
        callback.on_trial_result(0, [], Trial("a", {"model.steps": 2}), {"checks": 3, "epoch": 1.5, "valid_acc": 0.5})
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("trial-0001 continues from check 2: T=2")
    assert lines[1].endswith("trial-0002 started: T=1")
    assert console.replayed == 0 and console.trials["trial-0001"].checks == 3
