"""The platform's pure parts, without starting Ray: resource planning, shared-storage checks, search spaces."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from iaa.jobs.config.job_config import ConfigError, JobConfig
from iaa.jobs.config import search_space
from iaa.platform.cluster import resources, storage
from iaa.jobs.ports import TrialRecord, WorkerData
from iaa.jobs.config.presets import TUNE_PRESETS
from iaa.platform.cluster.resources import DRIVER_CPU, Node
from _faults import assert_says

pytestmark = pytest.mark.timeout(60)


def grid_size(space: search_space.SearchSpace) -> float:
    """Points in the space (``inf`` with a continuous range)."""
    size = 1.0
    for p in space.params.values():
        if p.choices is not None:
            size *= len(p.choices)
        elif p.integer or p.step:
            size *= math.floor((p.high - p.low) / (p.step or 1)) + 1
        else:
            return math.inf
    return size

LAPTOP = (Node("10.0.0.1", cpus=2),)
TWO_GPU_NODES = (Node("10.0.0.1", cpus=16, gpus=2), Node("10.0.0.2", cpus=16, gpus=2))


# --- resource planner -------------------------------------------------------------------------------


def _fits(nodes: tuple[Node, ...], plan: resources.TrialPlan) -> bool:
    """Whether ``max_concurrent`` trials (drivers and workers) pack onto the nodes, first fit."""
    free = [[n.cpus, n.gpus] for n in nodes]
    asks = []
    for _ in range(plan.max_concurrent):
        if plan.in_actor:
            asks.append((plan.trial_resources["cpu"], plan.trial_resources.get("gpu", 0.0)))
        else:
            asks.append((plan.trial_resources.get("cpu", 0.0), 0.0))
            asks += [(plan.worker_resources["CPU"], plan.worker_resources.get("GPU", 0.0))] * plan.workers
    for cpu, gpu in sorted(asks, reverse=True):
        slot = next((f for f in free if f[0] + 1e-9 >= cpu and f[1] + 1e-9 >= gpu), None)
        if slot is None:
            return False
        slot[0] -= cpu
        slot[1] -= gpu
    return True


def test_one_worker_trials_train_in_the_actor_one_per_core() -> None:
    plan = resources.plan(LAPTOP, 1)
    assert plan.in_actor and plan.threads == 1
    assert plan.trial_resources == {"cpu": 1.0} and plan.worker_resources == {}
    assert plan.max_concurrent == 2
    assert _fits(LAPTOP, plan)


def test_multi_worker_trial_driver_holds_a_sliver_and_everything_fits() -> None:
    """The deadlock a new user hit: a 1-CPU trial driver left no CPU for its 2 workers."""
    plan = resources.plan(LAPTOP, 2)
    assert plan.trial_resources == {"cpu": DRIVER_CPU}
    assert plan.worker_resources == {"CPU": 1 - DRIVER_CPU}
    assert plan.max_concurrent == 1
    assert _fits(LAPTOP, plan)
    assert plan.trial_resources["cpu"] + plan.workers * plan.worker_resources["CPU"] <= 2


def test_concurrency_is_capped_by_trials_and_by_user() -> None:
    assert resources.plan(LAPTOP, 1, num_trials=1).max_concurrent == 1
    assert resources.plan(LAPTOP, 1, max_concurrent=1).max_concurrent == 1


def test_too_many_concurrent_trials_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match="only 2 trial"):
        resources.plan(LAPTOP, 1, max_concurrent=3)


def test_a_trial_bigger_than_the_cluster_is_rejected_with_the_fix() -> None:
    with pytest.raises(ValueError, match="fits only 2 such worker"):
        resources.plan(LAPTOP, 3)
    with pytest.raises(ValueError, match="no node has 4 CPUs"):
        resources.plan(LAPTOP, 1, threads=4)
    with pytest.raises(ValueError, match="cluster has none"):
        resources.plan(LAPTOP, 1, gpus_per_worker=1)
    with pytest.raises(ValueError, match=">= 1"):
        resources.plan(LAPTOP, 0)


def test_gpu_trials_are_counted_by_gpus() -> None:
    plan = resources.plan(TWO_GPU_NODES, 2, gpus_per_worker=1)
    assert plan.worker_resources["GPU"] == 1 and plan.max_concurrent == 2
    assert plan.threads == 8
    assert _fits(TWO_GPU_NODES, plan)
    half = resources.plan(TWO_GPU_NODES, 1, gpus_per_worker=0.5)
    assert half.max_concurrent == 8 and half.trial_resources["gpu"] == 0.5
    assert _fits(TWO_GPU_NODES, half)


def test_workers_do_not_span_nodes() -> None:
    nodes = (Node("a", cpus=3), Node("b", cpus=3))
    plan = resources.plan(nodes, 1, threads=2)
    assert plan.max_concurrent == 2          # 6 CPUs, but only one 2-CPU worker per 3-CPU node
    assert _fits(nodes, plan)


def test_single_run_shares_the_machine_among_its_workers() -> None:
    plan = resources.plan(LAPTOP, 2, sweep=False)
    assert plan.threads == 1 and plan.worker_resources == {"CPU": 1} and plan.trial_resources == {}
    assert resources.plan(LAPTOP, 1, sweep=False).threads == 2


# --- shared storage ---------------------------------------------------------------------------------

MOUNTS = """\
overlay / overlay rw 0 0
/dev/sda1 /home ext4 rw 0 0
fileserver:/export /mnt/shared nfs4 rw 0 0
bucket /mnt/bucket fuse.gcsfuse rw 0 0
"""
TWO_HOSTS = (Node("10.0.0.1", 2), Node("10.0.0.2", 2))


def test_single_node_needs_no_shared_storage() -> None:
    storage.check_storage(None, (Node("10.0.0.1", 2),), mounts=MOUNTS)


def test_multi_node_requires_a_storage_path() -> None:
    with pytest.raises(ValueError, match="`storage_path` is required"):
        storage.check_storage(None, TWO_HOSTS, mounts=MOUNTS)


def test_multi_node_rejects_a_local_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(storage.ASSUME_SHARED_ENV, raising=False)
    with pytest.raises(ValueError, match="local ext4 file system"):
        storage.check_storage("/home/me/ckpt", TWO_HOSTS, mounts=MOUNTS)


def test_multi_node_accepts_nfs_buckets_and_fuse_mounts() -> None:
    storage.check_storage("/mnt/shared/iaa", TWO_HOSTS, mounts=MOUNTS)
    storage.check_storage("/mnt/bucket/runs", TWO_HOSTS, mounts=MOUNTS)
    storage.check_storage("s3://bucket/iaa", TWO_HOSTS, mounts=MOUNTS)
    storage.check_storage("gs://bucket/iaa", TWO_HOSTS, mounts=MOUNTS)
    with pytest.raises(ValueError, match="unsupported scheme"):
        storage.check_storage("ftp://host/iaa", TWO_HOSTS, mounts=MOUNTS)


def test_nodes_on_one_machine_share_any_path() -> None:
    same_host = (Node("127.0.0.1", 1), Node("127.0.0.1", 1))
    storage.check_storage("/home/me/ckpt", same_host, mounts=MOUNTS)


def test_filesystem_type_takes_the_longest_mount() -> None:
    assert storage.filesystem_type(Path("/mnt/shared/a/b"), MOUNTS) == "nfs4"
    assert storage.filesystem_type(Path("/mnt/sharedx"), MOUNTS) == "overlay"


# --- search spaces ----------------------------------------------------------------------------------


def test_paper_grid_is_the_papers() -> None:
    space = search_space.parse(search_space.PAPER_GRID, JobConfig())
    assert {k: p.choices for k, p in space.params.items()} == {
        "train.embed_l2": (1e-3, 1e-4), "model.steps": (3, 5, 8), "model.embed_dim": (256, 384),
        "model.hidden_dim": (128, 256), "model.state_dim": (256, 512)}
    assert grid_size(space) == 48


def test_yaml_ranges_choices_log_scale_and_fixed_values(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(
        "train.lr: {low: 1e-4, high: 3.0e-3, log: true}\n"      # 1e-4 is a string to YAML 1.1
        "model:\n"
        "  hidden_dim: {low: 64, high: 256, step: 64}\n"
        "  steps: [3, 5]\n"
        "  dropout: {low: 0.0, high: 0.5}\n"
        "train.batch_size: 64\n", encoding="utf-8")
    space = search_space.load(path, JobConfig())
    lr, hidden = space.params["train.lr"], space.params["model.hidden_dim"]
    assert (lr.low, lr.high, lr.log, lr.integer) == (1e-4, 3e-3, True, False)
    assert (hidden.low, hidden.high, hidden.step, hidden.integer) == (64, 256, 64, True)
    assert space.params["model.steps"].choices == (3, 5)
    assert space.fixed == {"train.batch_size": 64}
    from iaa.platform.sweeps.search.search_algorithm import to_optuna

    dists = to_optuna(space)
    assert dists["train.lr"].log and dists["model.hidden_dim"].step == 64
    assert type(dists["model.hidden_dim"]).__name__ == "IntDistribution"
    cfg = search_space.apply(JobConfig(), {**space.fixed, "model.steps": 5, "train.lr": 2e-3})
    assert (cfg.model.steps, cfg.train.lr, cfg.train.batch_size) == (5, 2e-3, 64)


@pytest.mark.parametrize("text, message", [
    ("model.depth: [1, 2]", "unknown key 'model.depth'"),
    ("model: [1, 2]", "is a section"),
    ("model.steps: []", "non-empty list"),
    ("model.steps: [1.5, 2]", "integer"),
    ("model.steps: [0, 2]", "model.steps=0 is not a valid config value"),
    ("train.lr: {low: 0.0, high: 1.0, log: true}", "log range needs low > 0"),
    ("train.lr: {low: 0.1, high: 0.01}", "must be below high"),
    ("train.lr: {low: 0.1}", "needs both low and high"),
    ("train.lr: {low: 0.1, high: 0.2, scale: log}", "unknown keys"),
    ("model.kind: [iaa, bert]", "not a valid config value"),
    ("dataset: [demo]", "comes from the data"),
    ("model.vocab_size: [10, 20]", "comes from the data"),
    ("train.lr: 0.001", "nothing to search"),
    ("[1, 2]", "expected a mapping"),
])
def test_bad_search_spaces_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as err:
        search_space.load(path, JobConfig())
    assert str(path) in str(err.value)


# --- the searcher and the scheduler -----------------------------------------------------------------


def test_the_searcher_is_told_a_trials_best_check_and_asha_the_current_one() -> None:
    from iaa.platform.sweeps.search import search_algorithm as search

    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    searcher = search.searcher(space, seed=0)
    config = searcher.suggest("t1")
    assert config["model.steps"] in (1, 2, 3)
    # the last check fell back from the trial's best: TPE must learn the best (0.6), not the last (0.3)
    searcher.on_trial_result("t1", {"valid_acc": 0.6, "best_valid_acc": 0.6, "training_iteration": 1})
    last = {"valid_acc": 0.3, "best_valid_acc": 0.6, "training_iteration": 2, "stop_reason": "max-epochs"}
    searcher.on_trial_result("t1", last)
    searcher.on_trial_complete("t1", last)
    [told] = searcher.study.trials
    assert told.value == 0.6 and told.intermediate_values == {1: 0.6, 2: 0.3}
    asha = search.scheduler(TUNE_PRESETS["demo"], max_t=4)
    assert asha.metric == "valid_acc" and searcher.metric == "best_valid_acc"


def test_the_searcher_proposes_every_configuration_of_a_finite_space_once_before_any_repeat() -> None:
    from optuna.trial import TrialState

    from iaa.platform.sweeps.search import search_algorithm as search

    space = search_space.parse(search_space.DEMO_GRID, JobConfig())
    size = space.size
    assert size is not None and size > 1
    for seed in range(3):
        searcher = search.searcher(space, seed=seed)
        proposed = [searcher.suggest(f"t{i}") for i in range(size)]
        keys = [tuple(sorted(c.items())) for c in proposed]
        assert len(set(keys)) == size, f"seed {seed} repeated a configuration: {keys}"
        for i, config in enumerate(proposed):
            searcher.on_trial_complete(f"t{i}", {"best_valid_acc": 0.5 + 0.01 * i, "stop_reason": "max-epochs"})
        assert searcher.suggest(f"t{size}") is not None            # space exhausted: a repeat is allowed now
        states = [t.state for t in searcher.study.trials]
        # repeats are drawn again before the study records a trial: no discarded (FAILED) trials
        assert states == [TrialState.COMPLETE] * size + [TrialState.RUNNING]
    ranged = search_space.parse({"train.lr": {"low": 1e-4, "high": 1e-2, "log": True}}, JobConfig())
    assert ranged.size is None and search.searcher(ranged, seed=0).suggest("t0") is not None


def _demo_proposals(seed: int) -> list[dict]:
    """The quick start's four trials, two at a time as on a 2-core laptop."""
    from iaa.platform.sweeps.search import search_algorithm as search

    preset = TUNE_PRESETS["demo"]
    searcher = search.searcher(search_space.parse(preset.space, JobConfig()), seed=seed)
    proposed = []
    for wave in range(0, preset.num_samples, 2):
        ids = [f"t{i}" for i in range(wave, wave + 2)]
        proposed += [searcher.suggest(t) for t in ids]
        for i, t in enumerate(ids):
            searcher.on_trial_complete(t, {"best_valid_acc": 0.4 + 0.05 * i, "stop_reason": "max-epochs"})
    return proposed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_quick_starts_four_trials_try_every_searched_value_deterministically(seed: int) -> None:
    proposed = _demo_proposals(seed)
    for key, values in TUNE_PRESETS["demo"].space.items():
        assert {c[key] for c in proposed} == set(values), f"seed {seed}: {key} never varied in {proposed}"
    assert len({tuple(sorted(c.items())) for c in proposed}) == 4
    assert _demo_proposals(seed) == proposed


def test_the_study_notes_too_few_trials_and_a_parameter_that_never_varied() -> None:
    from iaa.platform.sweeps.search import search_algorithm as search

    searcher = search.searcher(search_space.parse({"model.steps": [1, 2]}, JobConfig()), seed=0)
    for i in range(2):
        searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", {"best_valid_acc": 0.5, "stop_reason": "max-epochs"})
        notes = searcher.study.user_attrs["notes"]
        if i == 0:                                   # one trial: nothing compared, said once
            assert len(notes) == 1 and notes[0].startswith("1 scored trial(s): no two trials were compared")
        else:
            assert notes[-1].startswith("2 scored trial(s) are too few")
            assert not any(n.startswith("model.steps never varied") for n in notes)


def test_the_start_up_design_spreads_a_range_over_its_strata_and_walks_every_choice() -> None:
    import math

    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.search.space_filling import RANGE_STRATA

    space = search_space.parse({"train.lr": {"low": 1e-4, "high": 1e-2, "log": True}, "model.steps": [1, 2, 3]},
                               JobConfig())
    for seed in range(3):
        searcher = search.searcher(space, seed=seed)
        first = [searcher.suggest(f"t{i}") for i in range(RANGE_STRATA)]
        width = math.log(100) / RANGE_STRATA
        strata = {math.floor((math.log(c["train.lr"]) - math.log(1e-4)) / width) for c in first}
        assert strata == set(range(RANGE_STRATA)), f"seed {seed}: {first}"
        assert {c["model.steps"] for c in first} == {1, 2, 3}


def test_a_stop_that_meets_another_write_of_a_trial_still_fails_every_unfinished_trial(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """Marking a stopped sweep's trials FAIL can meet the sweep's own write of the same trial:
    SQLite's unique constraint, which Optuna raises as a ``StorageInternalError``. The write is
    made again, and no trial is left RUNNING."""
    import optuna
    from optuna.exceptions import StorageInternalError
    from optuna.storages import RDBStorage

    from iaa.platform.sweeps.studies.endings import fail_unfinished

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    study.ask(), study.ask()
    attr, met = RDBStorage.set_trial_user_attr, []

    def clashing(self, trial_id, key, value):
        if not met:
            met.append(trial_id)
            raise StorageInternalError("An exception is raised during the commit.")
        return attr(self, trial_id, key, value)

    monkeypatch.setattr(RDBStorage, "set_trial_user_attr", clashing)
    assert fail_unfinished(url, "s", {"interrupted": "SIGINT"}) == 2
    trials = optuna.load_study(study_name="s", storage=url).get_trials()
    assert met and [(t.state.name, t.user_attrs) for t in trials] == [("FAIL", {"interrupted": "SIGINT"})] * 2


def test_a_trial_asha_stopped_is_pruned_with_its_checks_in_a_persistent_study(tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    with bound_study(url, "demo-iaa-abc123"):
        searcher = search.searcher(space, seed=0, sweep="demo-iaa-abc123")
        searcher.suggest("t1")
        searcher.on_trial_result("t1", {"valid_acc": 0.4, "best_valid_acc": 0.4, "checks": 1})
        # Tune hands the result ASHA stops on to on_trial_complete only, never to on_trial_result
        searcher.on_trial_complete("t1", {"valid_acc": 0.35, "best_valid_acc": 0.4, "checks": 2, "stop_reason": ""})
    [trial] = optuna.load_study(study_name="demo-iaa-abc123", storage=url).trials   # read back from the file
    assert trial.state == TrialState.PRUNED and trial.intermediate_values == {1: 0.4, 2: 0.35}
    assert trial.user_attrs["stopped_by"] == "asha"


def test_a_trial_that_ends_on_its_own_keeps_the_check_delivered_with_its_end(tmp_path: Path) -> None:
    """A trial that finishes right after its last report may have that check reach the searcher
    only with ``on_trial_complete``: it is still one of the study's intermediate values."""
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    with bound_study(url, "ends"):
        searcher = search.searcher(space, seed=0, sweep="ends")
        searcher.suggest("t1")
        searcher.on_trial_result("t1", {"valid_acc": 0.4, "best_valid_acc": 0.4, "checks": 1})
        searcher.on_trial_complete("t1", {"valid_acc": 0.5, "best_valid_acc": 0.5, "checks": 2,
                                          "stop_reason": "max-epochs"})
    [trial] = optuna.load_study(study_name="ends", storage=url).trials
    assert trial.state == TrialState.COMPLETE and trial.intermediate_values == {1: 0.4, 2: 0.5}


def test_a_trial_that_failed_and_runs_again_from_its_checkpoint_comes_back_with_its_checks(tmp_path: Path) -> None:
    """A trial that lost its worker ends FAIL; when a resumed sweep runs it again (from its last
    checkpoint, under the same Tune id) the study gets a new trial with its configuration and checks."""
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    with bound_study(url, "again"):
        searcher = search.searcher(space, seed=0, sweep="again")
        params = searcher.suggest("t1")
        searcher.on_trial_result("t1", {"valid_acc": 0.4, "best_valid_acc": 0.4, "checks": 1})
        searcher.on_trial_complete("t1", None, error=True)
        searcher.on_trial_result("t1", {"valid_acc": 0.5, "best_valid_acc": 0.5, "checks": 2})
        searcher.on_trial_complete("t1", {"valid_acc": 0.5, "best_valid_acc": 0.5, "checks": 2,
                                          "stop_reason": "max-epochs"})
    failed, again = optuna.load_study(study_name="again", storage=url).trials
    assert failed.state == TrialState.FAIL and failed.intermediate_values == {1: 0.4}
    assert again.state == TrialState.COMPLETE and again.intermediate_values == {1: 0.4, 2: 0.5}
    assert again.params == failed.params == params and again.user_attrs["continues_trial"] == failed.number


def test_a_trial_a_stop_cut_off_before_tune_saved_it_runs_again_under_its_name(tmp_path: Path) -> None:
    """Tune saves a sweep (its searcher with it) every few seconds: a trial asked after the last
    save is unknown to the resumed sweep, whose first new trial runs its configuration again,
    under its name, and tells the sweep's runs which trial it replaces; the next one is new."""
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study, stopped_and_resumed

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3, 4], "model.hidden_dim": [16, 32]}, JobConfig())
    with bound_study(url, "cut"):
        first = search.searcher(space, seed=0, sweep="cut")
        first.suggest("a")
        first.save(str(tmp_path / "searcher.json"))            # Tune's last save before the stop
        cut = first.suggest("b")
        resumed = stopped_and_resumed(url, "cut", space, tmp_path / "searcher.json")
        again = resumed.suggest("c")
        new = resumed.suggest("d")
        assert driver_side.of("cut").again == {"c": "b"}
    trials = optuna.load_study(study_name="cut", storage=url).trials
    assert again == cut and new not in (cut, trials[0].params)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]
    assert trials[2].user_attrs["trial_name"] == trials[1].user_attrs["trial_name"] == "trial-0001"
    assert trials[2].user_attrs["continues_trial"] == 1 and trials[2].user_attrs["tune_trial_id"] == "c"
    assert "interrupted" not in trials[2].user_attrs and trials[3].user_attrs["trial_name"] == "trial-0003"


def test_grace_period_and_reduction_factor_override_the_preset_and_reach_asha() -> None:
    from iaa.jobs.tune import tune
    from iaa.platform.sweeps.search import search_algorithm as search

    preset = TUNE_PRESETS["demo"]
    assert tune.asha_preset(tune.TuneRequest(dataset="demo")) == preset
    tuned = tune.asha_preset(tune.TuneRequest(dataset="demo", grace_period=1, reduction_factor=3.0))
    assert (tuned.grace_period, tuned.reduction_factor, tuned.num_samples) == (1, 3.0, preset.num_samples)
    asha = search.scheduler(tuned, max_t=5)
    assert asha._reduction_factor == 3.0
    # rungs at 1 and 3 checks: the milestones ASHA compares trials at
    assert sorted(m for m, _ in asha._brackets[0]._rungs) == [1, 3]
    with pytest.raises(ConfigError, match="`grace_period`"):
        tune.TuneRequest(dataset="demo", grace_period=0)
    with pytest.raises(ConfigError, match="`reduction_factor`"):
        tune.TuneRequest(dataset="demo", reduction_factor=1.0)


def test_a_set_of_a_searched_key_is_named_as_having_no_effect() -> None:
    from iaa.jobs.tune import tune

    space = search_space.parse(search_space.PAPER_GRID, JobConfig())
    notes = tune.searched_overrides(("model.embed_dim=64", "train.lr=0.002", "model.steps = 2"), space)
    assert len(notes) == 2
    assert notes[0].startswith("`sets` model.embed_dim=64 has no effect") and "{256, 384}" in notes[0]
    assert "model.steps" in notes[1] and not any("train.lr" in n for n in notes)


def test_tune_cli_refuses_a_reduction_factor_of_one() -> None:
    from click.testing import CliRunner

    from iaa.cli import cli

    result = CliRunner().invoke(cli, ["tune", "--dataset", "demo", "--reduction-factor", "1"])
    assert result.exit_code == 2 and "--reduction-factor" in result.output


# --- sweep names, records and epochs -----------------------------------------------------------------


def test_resume_alone_finds_the_latest_sweep_of_the_dataset_and_model_whatever_its_name(tmp_path: Path) -> None:
    """``tune --resume --dataset demo``: the most recently written sweep of demo and iaa, named with
    ``--name`` or not; another dataset's or model's sweep is not it, and none is one line."""
    import os

    from iaa.errors import IaaError
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune import tune

    def sweep(name: str, dataset: str, kind: str, written: float) -> None:
        path = record.sweep_file(tmp_path, name)
        path.parent.mkdir(parents=True)
        base = to_dict(JobConfig(dataset=dataset))
        base["model"]["kind"] = kind
        record.write(path, record.SweepRecord(name=name, dataset=dataset, base=base))
        os.utime(path, (written, written))

    sweep("s1", "demo", "iaa", 1000.0)
    sweep("demo-iaa-3f9c2a", "demo", "iaa", 2000.0)
    sweep("s3", "demo", "iaa", 3000.0)                   # the latest of demo and iaa
    sweep("s4", "demo", "as-reader", 4000.0)              # another model
    sweep("s5", "cbt-ne", "iaa", 5000.0)                  # another dataset
    assert tune.sweep_name(tune.TuneRequest(dataset="demo", workdir=tmp_path, resume=True)) == "s3"
    assert tune.sweep_name(tune.TuneRequest(dataset="demo", model_kind="as-reader", workdir=tmp_path,
                                            resume=True)) == "s4"
    with pytest.raises(IaaError) as none:
        tune.sweep_name(tune.TuneRequest(dataset="cbt-cn", workdir=tmp_path, resume=True))
    assert_says(str(none.value), "no sweep of iaa on cbt-cn", "its sweeps, newest first: s5, s4, s3")


def test_default_sweep_names_are_unique_and_a_taken_name_is_refused(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.tune import tune
    from iaa.platform.sweeps import launch

    names = {tune.sweep_name(tune.TuneRequest(dataset="demo", workdir=tmp_path)) for _ in range(20)}
    assert len(names) == 20 and all(n.startswith("demo-iaa-") for n in names)
    storage = tmp_path / "ray"
    (storage / "mine").mkdir(parents=True)
    (storage / "mine" / "keep.txt").write_text("x")
    with pytest.raises(IaaError, match="already exists"):
        launch.claim(str(storage), "mine", tmp_path / "sweeps" / "mine")
    assert (storage / "mine" / "keep.txt").read_text() == "x" and not (tmp_path / "sweeps" / "mine").exists()
    launch.claim(str(storage), "other", tmp_path / "sweeps" / "other")
    with pytest.raises(IaaError, match="already exists"):
        launch.claim(str(storage), "other", tmp_path / "sweeps" / "other")   # the sweep folder is taken now


def test_a_default_name_finds_the_latest_sweep_and_records_round_trip(tmp_path: Path) -> None:
    import os

    from iaa.errors import IaaError
    from iaa.jobs.sweeps import record as sweep

    rec = TrialRecord(trial_id="t1", config=JobConfig(), params={"model.steps": 2}, best_valid_acc=0.5,
                            checkpoint="/c.pt", mlflow_run_id="r", checks=3, steps=30, stop_reason="asha",
                            name="trial-0001")
    for i, name in enumerate(("demo-iaa-aaaaaa", "demo-iaa-bbbbbb")):
        sweep.write(sweep.sweep_file(tmp_path, name), sweep.SweepRecord(name=name, trials=(rec,)))
        os.utime(sweep.sweep_file(tmp_path, name), (1000 + i, 1000 + i))
    assert sweep.find(tmp_path, "demo-iaa").parent.name == "demo-iaa-bbbbbb"
    assert sweep.find(tmp_path, "demo-iaa-aaaaaa").parent.name == "demo-iaa-aaaaaa"
    loaded = sweep.read(sweep.sweep_file(tmp_path, "demo-iaa-aaaaaa"))
    assert loaded.trials == (rec,)
    assert sweep.table(loaded.trials, ["model.steps"]).splitlines()[1].split()[1] == "trial-0001"   # its one name
    with pytest.raises(IaaError) as missing:
        sweep.find(tmp_path, "cnn-iaa")
    assert_says(missing.value, "no sweep 'cnn-iaa'", "newest first: demo-iaa-bbbbbb, demo-iaa-aaaaaa")
    with pytest.raises(IaaError) as none:
        sweep.find(tmp_path / "empty", "cnn-iaa")
    assert_says(none.value, "holds no sweep", "`workdir`")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests._tiny import make_tiny_prepared

    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("sets, config_text, max_epochs, expected", [
    ((), None, None, 4.0),                                # the tune preset's budget
    (("train.max_epochs=10",), None, None, 10.0),         # equal to the dataset preset: still the user's
    ((), "train:\n  max_epochs: 10\n", None, 10.0),       # from the config file
    (("train.max_epochs=3",), None, 2.0, 2.0),            # --max-epochs wins
])
def test_an_explicit_max_epochs_is_kept_whatever_it_is(tiny: Path, tmp_path: Path, sets: tuple, config_text: str | None,
                                                        max_epochs: float | None, expected: float) -> None:
    from iaa.jobs.tune import tune

    config_file = None
    if config_text is not None:
        config_file = tmp_path / "c.yaml"
        config_file.write_text(config_text)
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, sets=sets, config_file=config_file, max_epochs=max_epochs,
                           workdir=tmp_path / "w")
    assert tune.settle(req).base.train.max_epochs == expected


@pytest.mark.parametrize("args, message", [
    (["--resume", "gone"], "no sweep 'gone' to resume in the work folder"),
    (["--name", "gone", "--resume"], "give the --workdir it ran in"),
    (["--resume"], "no sweep of iaa on cbt-ne in the work folder"),
    (["--resume", "a", "--name", "b"], "name different sweeps"),
])
def test_resume_names_the_sweep_to_continue(tiny: Path, tmp_path: Path, args: list, message: str) -> None:
    from click.testing import CliRunner

    from iaa.cli import cli

    out = CliRunner().invoke(cli, ["tune", "--dataset", "cbt-ne", "--data", str(tiny), "--workdir", str(tmp_path),
                                   *args, "--json"])
    assert out.exit_code != 0 and message in out.output, out.output


def test_ray_run_names_are_unique_per_fresh_run_and_kept_on_resume(tmp_path: Path) -> None:
    """Two run folders called ``run`` sharing a storage path never share (or delete) a Ray run."""
    from iaa.platform.train_workers import ray_run_name

    a, b = tmp_path / "alice" / "run", tmp_path / "bob" / "run"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    name_a, previous_a = ray_run_name(a, resume=False)
    name_b, _ = ray_run_name(b, resume=False)
    assert previous_a is None and name_a != name_b and name_a.startswith("run-")
    assert ray_run_name(a, resume=True) == (name_a, None)          # --resume continues the same run
    again, previous = ray_run_name(a, resume=False)                 # --overwrite: a new run ...
    assert again != name_a and previous == name_a                   # ... that may delete only its own
    assert ray_run_name(tmp_path / "old", resume=True)[0] == "old"  # recorded before: the folder name


def test_a_train_run_failed_by_expected_worker_errors_is_one_line_and_a_bug_keeps_its_traceback() -> None:
    """Ray reports each failed worker's own exception by rank; only all-expected failures become IaaError."""
    from ray.train import WorkerGroupError

    from iaa.errors import IaaError
    from iaa.platform.ray_train import raise_failure

    no_rows = IaaError("rank 1 of 2 has no training rows: use fewer workers")
    expected = WorkerGroupError("rank 1 failed", {1: no_rows})
    with pytest.raises(IaaError, match=r"run r-1 failed on rank 1 of its workers: .*use fewer workers") as caught:
        raise_failure("r-1", expected)
    assert caught.value.__cause__ is expected
    bug = WorkerGroupError("rank 0 failed", {0: KeyError("model"), 1: no_rows})
    with pytest.raises(RuntimeError, match="run r-2 failed") as caught:
        raise_failure("r-2", bug)
    assert not isinstance(caught.value, IaaError) and caught.value.__cause__ is bug


class _HealthCheckFailed(Exception):
    """As Ray Train's own health-check error: the actor's death held in an attribute."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__("A worker health check failed.")
        self.health_check_failure = failure


def test_a_lost_worker_is_found_however_ray_wraps_it_and_an_error_of_the_code_is_not() -> None:
    from ray.exceptions import ActorDiedError, NodeDiedError, WorkerCrashedError
    from ray.train import WorkerGroupError

    from iaa.platform.cluster.lost import worker_lost

    died = ActorDiedError()
    assert worker_lost(died) and worker_lost(WorkerCrashedError()) and worker_lost(NodeDiedError("gone"))
    assert worker_lost(WorkerGroupError("rank 0", {0: _HealthCheckFailed(died), 1: RuntimeError("peer closed")}))
    try:
        try:
            raise died
        except ActorDiedError as err:
            raise RuntimeError("the trial failed") from err
    except RuntimeError as chained:
        assert worker_lost(chained)
    assert not worker_lost(WorkerGroupError("rank 0", {0: KeyError("model"), 1: RuntimeError("peer closed")}))
    assert not worker_lost(None) and not worker_lost(ValueError("bad"))


def test_a_train_run_that_lost_its_workers_with_no_restores_left_is_restores_spent(monkeypatch) -> None:
    from ray.exceptions import ActorDiedError
    from ray.train import WorkerGroupError

    from iaa.jobs.ports import RestoresSpent
    from iaa.platform.ray_train import raise_failure

    monkeypatch.setenv("IAA_MAX_FAILURES", "3")
    lost = WorkerGroupError("rank 1", {1: _HealthCheckFailed(ActorDiedError()), 0: RuntimeError("peer closed")})
    with pytest.raises(RestoresSpent) as caught:
        raise_failure("r-3", lost)
    assert "\n" not in str(caught.value) and "run r-3 lost a worker" in str(caught.value)
    assert "after 3 restore(s)" in str(caught.value) and caught.value.__cause__ is lost


def _result(trial_id: str, error: BaseException | None, **metrics: object) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(metrics={"trial_id": trial_id, **metrics}, path=f"/runs/{trial_id}", error=error,
                           config={"model.steps": 1}, best_checkpoints=[])


def test_trial_records_take_the_end_from_the_results_and_mark_a_lost_worker(tmp_path: Path) -> None:
    """Tune's saved state can still say RUNNING (read back as PENDING) for a trial that failed as
    the run ended: a trial with an error is ERROR, and one whose worker died is ``worker-lost``."""
    from ray.exceptions import ActorDiedError

    from iaa.jobs.ports import WORKER_LOST
    from iaa.platform.sweeps.trials.trial import TrialSpec, records

    spec = TrialSpec(name="s", fit=lambda *a, **k: None, storage_path=str(tmp_path), workers=1, threads=1,
                     base={"dataset": "cbt-ne"})
    results = [_result("a", ActorDiedError(), checks=2, best_valid_acc=0.5), _result("b", ValueError("bad data")),
               _result("c", None, checks=6, best_valid_acc=0.6, stop_reason="max-epochs"), _result("d", None)]
    statuses = {"a": "PENDING", "b": "PENDING", "c": "TERMINATED", "d": "PENDING"}
    got = {r.trial_id: r for r in records(results, spec, statuses=statuses, run_ids={}, tagged={}, downloads=tmp_path,
                                          names={"a": "trial-0000"})}
    assert [(t, r.status, r.stop_reason) for t, r in got.items()] == [
        ("a", "ERROR", WORKER_LOST), ("b", "ERROR", ""), ("c", "TERMINATED", "max-epochs"), ("d", "PENDING", "")]
    assert got["a"].lost and not got["b"].lost and got["a"].label == "trial-0000" and got["a"].best_valid_acc == 0.5


def test_a_trial_tune_saved_as_pending_after_a_check_is_recorded_running(tmp_path: Path) -> None:
    """Tune saves a running trial as PENDING, to start it again on a restore: a stopped sweep's
    record says RUNNING of one that had made a check, and PENDING of one that had made none."""
    from iaa.platform.sweeps.trials.trial import TrialSpec, records

    spec = TrialSpec(name="s", fit=lambda *a, **k: None, storage_path=str(tmp_path), workers=1, threads=1,
                     base={"dataset": "cbt-ne"})
    results = [_result("a", None, checks=1, best_valid_acc=0.2), _result("b", None)]
    got = records(results, spec, statuses={"a": "PENDING", "b": "PENDING"}, run_ids={}, tagged={}, downloads=tmp_path)
    assert [(r.trial_id, r.status, r.checks) for r in got] == [("a", "RUNNING", 1), ("b", "PENDING", 0)]


def test_a_sweep_with_a_trial_that_lost_its_worker_is_not_finished_and_resuming_runs_it_again() -> None:
    from dataclasses import replace

    from iaa.jobs.sweeps.record import SweepRecord
    from iaa.jobs.tune.stops import Standing, lost_trials, standing

    cfg = JobConfig()
    done = [TrialRecord(trial_id=t, config=cfg, best_valid_acc=0.5, status="TERMINATED") for t in ("a", "b")]
    lost = TrialRecord(trial_id="c", config=cfg, status="ERROR", stop_reason="worker-lost", checks=2)
    failed = replace(lost, trial_id="d", stop_reason="")
    assert SweepRecord(name="s", num_samples=3, trials=(*done, failed)).finished
    record = SweepRecord(name="s", num_samples=3, trials=(*done, lost))
    assert not record.finished and lost_trials(record) == {"c"}

    class Runs:
        def find_runs(self, experiment, tags):
            from types import SimpleNamespace

            return [SimpleNamespace(run_id=t, parent_run_id="p", tags={"trial_id": t}, status=status)
                    for t, status in (("a", "FINISHED"), ("b", "FINISHED"), ("c", "FAILED"))]

        def metric_history(self, run_id, key):
            return [object()] * 2 if run_id == "c" else []

    assert standing(Runs(), "e", "s", "p") == Standing(finished=3, unfinished=0, checkpointed=0)
    assert standing(Runs(), "e", "s", "p", lost_trials(record)) == Standing(finished=2, unfinished=1, checkpointed=1)


def test_the_runs_of_a_resumed_sweep_name_their_trials_by_the_numbers_they_started_with() -> None:
    from types import SimpleNamespace

    from iaa.platform.sweeps.trials.trial_runs import child_runs

    class Runs:
        def find_runs(self, experiment, tags):         # newest first, as the store lists them
            return [SimpleNamespace(parent_run_id="p", run_id="r2", tags={"trial_id": "a", "trial_number": "0004"}),
                    SimpleNamespace(parent_run_id="p", run_id="r1", tags={"trial_id": "a", "trial_number": "0001",
                                                                         "checkpoint": "/c/a/checkpoint.pt"}),
                    SimpleNamespace(parent_run_id="p", run_id="r3", tags={"trial_id": "b", "member": "seed-1"}),
                    SimpleNamespace(parent_run_id="q", run_id="r4", tags={"trial_id": "c", "trial_number": "0002"})]

    found = child_runs(Runs(), "e", "s", "p")
    assert found.run_ids == {"a": "r2", "b": "r3"} and found.checkpoints == {"a": "/c/a"}
    assert found.names == {"a": "trial-0004"}


def test_cluster_sessions_report_the_checkpoint_score_and_when_the_first_batch_went_out(tiny: Path) -> None:
    """What Tune and Ray Train receive through the link: the base report plus the score Ray ranks checkpoints by."""
    from contextlib import nullcontext

    from iaa.data.loading.loader import PreparedData
    from iaa.jobs.ports import CHECKPOINT_FILE, CHECKPOINT_SCORE
    from iaa.jobs.training.session import ClusterSession

    class Recorder:
        rank, world_size, device = 0, 1, "cpu"

        def __init__(self):
            self.published = []

        def all_reduce(self, values, op):
            return [float(v) for v in values]

        def prepare_model(self, model):
            return model

        def last_checkpoint(self):
            return nullcontext(None)

        def publish(self, metrics, folder):
            self.published.append((metrics, folder is not None and (folder / CHECKPOINT_FILE).is_file()))

    data = PreparedData.open(tiny)
    link = Recorder()
    session = ClusterSession(link, data.table("train"), data.table("valid"), batch_size=4, seed=0, threads=0)
    assert session.latest_state() is None
    assert session.first_step_at is None
    next(session.train_batches(0))
    first = session.first_step_at
    assert first is not None
    next(session.train_batches(1))
    assert session.first_step_at == first                       # the first batch of the run, not of an epoch
    state = {"progress": {"checks": 2, "step": 7, "best_step": 7}}
    session.report({"valid_acc": 0.25}, state, True)
    session.report({"valid_acc": 0.25}, state, False)
    (best, wrote_best), (tie, wrote_tie) = link.published
    assert wrote_best and wrote_tie                             # one worker: rank 0 writes every checkpoint
    assert best[CHECKPOINT_SCORE] == 0.25 and tie[CHECKPOINT_SCORE] == -1.0   # a tie never displaces the best
    assert best["first_step_at"] == first and best["steps"] == 7 and best["is_best"] and not tie["is_best"]


def test_a_restored_searcher_continues_the_same_persistent_study(tmp_path: Path) -> None:
    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    with bound_study(url, "s"):
        first = search.searcher(space, seed=0, sweep="s")
        first.suggest("a")
        first.save(str(tmp_path / "searcher.json"))            # what Tune keeps for --resume
        again = search.searcher(space, seed=0, sweep="s")
        again.restore(str(tmp_path / "searcher.json"))
        again.suggest("b")
    import optuna

    trials = optuna.load_study(study_name="s", storage=url).trials
    assert len(trials) == 2 and trials[0].params != trials[1].params   # one study, no repeat across the restart


def test_a_pyfunc_model_logged_without_its_loader_names_the_way_out() -> None:
    from iaa.errors import IaaError
    from iaa.platform.mlflow_model import ReaderModel

    old = object.__new__(ReaderModel)           # what unpickling a model of an older iaa gives
    with pytest.raises(IaaError, match="log it again"):
        old.load_context(None)


def test_a_trial_hands_the_jobs_loop_its_config_with_the_base_settings_and_its_sampled_values() -> None:
    """``--set model.steps=2`` reaches the loop the job injected: base config, fixed and sampled values merged."""
    from iaa.jobs.config.job_config import apply, to_dict
    from iaa.platform.sweeps.trials.trial import TrialSpec, run_trial

    seen = []

    def fit(cfg, link, data, **kwargs):
        seen.append((cfg, link.rank, link.world_size, data, kwargs))

    base = apply(JobConfig(), {"model.steps": 2})              # what resolve makes of --set model.steps=2
    spec = TrialSpec(name="t", fit=fit, storage_path="", workers=1, threads=1, base=to_dict(base),
                     fixed={"train.batch_size": 8}, vocab_hash="h", vocab={"json": "{}"})
    run_trial({"train.lr": 2e-3}, spec=spec, train="TRAIN", valid="VALID")
    ((cfg, rank, world, data, kwargs),) = seen
    assert (cfg.model.steps, cfg.train.batch_size, cfg.train.lr) == (2, 8, 2e-3) and (rank, world) == (0, 1)
    assert kwargs == {"threads": 1}
    assert data == WorkerData(vocab_hash="h", train="TRAIN", valid="VALID", vocab={"json": "{}"})


def test_the_clusters_lines_go_to_a_blocks_file_and_nowhere_else_once_ray_is_joined(tmp_path: Path, capsys) -> None:
    """What Ray's listener thread prints goes to the file of a ``cluster_lines_to`` block, and
    outside any block (a node lost as the command ends) to no stream; other threads print as ever."""
    import threading

    from iaa.platform.cluster import driver_lines
    from iaa.platform.cluster.ray_internals import ERROR_LISTENER_THREAD

    def listener(text: str) -> None:
        thread = threading.Thread(target=lambda: print(text), name=ERROR_LISTENER_THREAD)
        thread.start()
        thread.join()

    driver_lines.off_the_console()
    driver_lines.off_the_console()                       # once is enough: no second wrapper
    assert not isinstance(getattr(sys.stdout, "_stream", None), driver_lines.RoutedStream)
    from ray._private import worker                      # two agents of a dead node publish one dump:
    dump = {"ip": "10.0.0.2", "job": "01", "is_err": False, "lines": ["Raylet is terminated: unexpected"]}
    with driver_lines.cluster_lines_to(tmp_path / "driver.log"):
        listener("(raylet) in the block")
        print("the command's line")
        for pid in ("raylet", "autoscaler"):             # Ray prints the first, holds the second back
            worker.stdout_deduplicator.deduplicate({**dump, "pid": pid})
    listener("(raylet) marked dead, after the block")
    print("the command's output")
    assert worker.stdout_deduplicator.flush() == []      # nothing left for ray.shutdown to print on stdout
    shown = capsys.readouterr()
    assert shown.out == "the command's line\nthe command's output\n" and shown.err == ""
    assert (tmp_path / "driver.log").read_text() == ("(raylet) in the block\n"
                                                     "(autoscaler, ip=10.0.0.2) Raylet is terminated: unexpected\n")


class _Queue:
    """A driver's queue of checks: ``items`` come out in turn, an exception is raised."""

    def __init__(self, *items: object) -> None:
        self.items = list(items)

    def get(self, timeout: float) -> object:
        item = self.items.pop(0) if self.items else RuntimeError("the queue's actor died")
        if isinstance(item, BaseException):
            raise item
        return item

    def empty(self) -> bool:
        return not self.items

    def shutdown(self) -> None:
        pass


@pytest.mark.timeout(60)                                   # a drain that never ends fails, not hangs
def test_a_train_runs_checks_wait_out_an_empty_queue_and_a_lost_one_is_one_line(tmp_path, capsys, console) -> None:
    from ray.util.queue import Empty

    from iaa.platform.train_workers import WorkerChecks

    seen: list[dict] = []
    checks = WorkerChecks(_Queue(Empty(), {"checks": 1, "step": 4}, Empty(), {"checks": 2, "step": 8}), tmp_path,
                     on_metrics=seen.append, show_progress=False)
    checks._drain()                                        # the queue's actor dies after the two checks
    assert [m["checks"] for m in checks.history] == [1, 2] and len(seen) == 2
    [line] = [text for text in capsys.readouterr().err.splitlines() if text.strip()]
    assert_says(line, "the queue that brings the workers' checks here was lost", "(RuntimeError)")


def test_a_resume_leaves_tunes_word_on_trials_that_never_reported_off_the_console(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """``Tuner.restore`` reads the run's results, and a trial a stop left pending has none: Tune's
    "Failed to fetch metrics" warning names its internal id, before the sweep's log file is open."""
    from ray import tune

    from iaa.platform.sweeps import tune_run

    def restore(path, trainable, resume_errored):
        logging.getLogger("ray.tune.analysis.experiment_analysis").warning(
            "Failed to fetch metrics for 1 trial(s): run_trial_86346ba9")
        logging.getLogger("ray.tune.analysis.experiment_analysis").error("a real failure")
        return "restored"

    monkeypatch.setattr(tune.Tuner, "restore", restore)
    monkeypatch.setattr(tune.Tuner, "can_restore", lambda path: True)
    monkeypatch.setattr(tune_run, "check_private", lambda path: None)
    monkeypatch.setattr(tune_run, "analysis", lambda path: SimpleNamespace(trials=[]))   # no checkpoint to mend
    logger, heard = logging.getLogger("ray.tune.analysis.experiment_analysis"), []
    handler = logging.Handler()
    handler.emit = heard.append                           # Ray's loggers do not propagate to the root
    logger.addHandler(handler)
    try:
        assert tune_run.restore(SimpleNamespace(experiment_path=str(tmp_path)), fn=None) == "restored"
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in heard] == ["a real failure"]
    assert logger.level == logging.NOTSET                 # as it was


def test_a_saved_sweep_naming_code_this_version_lacks_is_one_error_naming_the_way_on(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """Tune pickles a sweep's searcher and callbacks by module path: a version that moved one of
    them cannot load the state another saved, and says so in one line instead of a traceback."""
    from ray import tune

    from iaa.errors import IaaError
    from iaa.platform.sweeps import tune_run

    def restore(path, trainable, resume_errored):
        raise ModuleNotFoundError("No module named 'iaa.platform.sweeps.gone'")

    monkeypatch.setattr(tune.Tuner, "restore", restore)
    monkeypatch.setattr(tune.Tuner, "can_restore", lambda path: True)
    monkeypatch.setattr(tune_run, "check_private", lambda path: None)
    monkeypatch.setattr(tune_run, "analysis", lambda path: SimpleNamespace(trials=[]))   # no checkpoint to mend
    with pytest.raises(IaaError) as refused:
        tune_run.restore(SimpleNamespace(experiment_path=str(tmp_path), name="s1"), fn=None)
    assert_says(refused.value, str(tmp_path), "iaa.platform.sweeps.gone", "another version", "`warm_start` s1")


def test_a_train_run_whose_driving_actor_is_lost_is_restores_spent_with_its_checkpoint_kept() -> None:
    """The cluster's head (or the controller's node) dies: Train V2's ``fit`` raises Ray's actor
    error, not a failed run; it ends the command in one line that keeps the last checkpoint and
    says how to continue (``iaa.jobs.train.train`` adds the resume line), not a traceback."""
    import ray.exceptions

    from iaa.jobs.ports import RestoresSpent
    from iaa.platform.train_workers import fit_or_fail

    class Trainer:
        def fit(self):
            raise ray.exceptions.ActorUnavailableError("The actor is temporarily unavailable: RpcError", b"\0" * 16)

    with pytest.raises(RestoresSpent) as lost:
        fit_or_fail(Trainer(), "run-1")
    assert_says(lost.value, "Ray Train run run-1 lost the actor that drives it", "ActorUnavailableError",
                "the cluster's head node")


# --- a sweep's saved Tune state, named by an earlier module layout ----------------------------------

_LOAD_EARLIER = """
import pickle, sys
saved = open(sys.argv[1], "rb").read()
try:
    pickle.loads(saved)
    print("loaded before keep")
except ModuleNotFoundError as err:
    print("not found:", err.name)
from iaa.platform.sweeps import saved_state
saved_state.keep()
print(" ".join(f"{type(o).__module__}.{type(o).__name__}" for o in pickle.loads(saved)))
"""


def test_a_sweep_saved_before_the_sub_packages_loads_its_searcher_scheduler_and_callbacks(tmp_path: Path) -> None:
    """What Tune pickles of a sweep (``tuner.pkl``: the searcher with its sampler, ASHA, the
    callbacks), with each class named at the path an earlier version saved, loads after
    ``saved_state.keep`` as the classes that this version holds."""
    import pickle
    import subprocess

    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.trials.trial_events import ConsoleCallback
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    saved = [search.searcher(space, seed=0, sweep="s"), search.searcher(space, seed=0, sweep="s", sampler="grid"),
             search.scheduler(TUNE_PRESETS["demo"], max_t=4, sweep="s"), TrialRuns("s"), ConsoleCallback("s")]
    now = pickle.dumps(saved, protocol=0)          # protocol 0 names each class as text: `c<module>\n<name>\n`
    earlier = now.replace(b"iaa.platform.sweeps.search.", b"iaa.platform.sweeps.").replace(
        b"iaa.platform.sweeps.trials.", b"iaa.platform.sweeps.")
    assert earlier != now
    (tmp_path / "tuner.pkl").write_bytes(earlier)

    done = subprocess.run([sys.executable, "-c", _LOAD_EARLIER, str(tmp_path / "tuner.pkl")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    first, loaded = done.stdout.splitlines()
    assert first.startswith("not found: iaa.platform.sweeps.")       # the earlier paths are gone from the package
    assert loaded.split() == [
        "iaa.platform.sweeps.search.distinct_search.StudySearch", "iaa.platform.sweeps.search.distinct_search.StudySearch",
        "iaa.platform.sweeps.search.asha.GivenAside", "iaa.platform.sweeps.trials.trial_runs.TrialRuns",
        "iaa.platform.sweeps.trials.trial_events.ConsoleCallback"]


def test_a_trial_tune_never_ends_has_its_result_files_closed_when_the_run_ends(tmp_path: Path) -> None:
    """Tune closes a trial's result files only when it ends the trial, which a time-budget stop
    never does: the run's end closes them, TensorBoard's writer thread with them."""
    import threading

    pytest.importorskip("tensorboardX", reason="TensorBoard's writer is tensorboardX's")
    from iaa.platform.sweeps.trials import result_files

    def writers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if type(t).__module__.startswith("tensorboardX")}

    before = writers()
    class Trial:                                 # what the loggers read of Tune's Trial
        local_path, checkpoint = str(tmp_path / "trial"), None
        config = evaluated_params = {"lr": 0.1}

        def init_local_path(self) -> None:
            Path(self.local_path).mkdir(exist_ok=True)

    trial = Trial()
    loggers = result_files.loggers()
    assert [type(x).__name__ for x in loggers] == ["CsvFiles", "JsonFiles", "TensorBoardFiles"]
    for logger in loggers:
        logger.on_trial_start(iteration=0, trials=[trial], trial=trial)
        logger.on_trial_result(iteration=1, trials=[trial], trial=trial,
                               result={"training_iteration": 1, "valid_acc": 0.5, "timesteps_total": None})
    assert writers() - before, "the writer runs while the trial does"
    for logger in loggers:
        logger.on_experiment_end(trials=[trial])
    assert not writers() - before
    assert {p.name for p in (tmp_path / "trial").iterdir()} >= {"progress.csv", "result.json"}
    assert "valid_acc" in (tmp_path / "trial" / "progress.csv").read_text()


def test_a_trial_whose_saved_last_checkpoint_is_gone_gets_the_newest_older_one_under_its_name(tmp_path: Path) -> None:
    """A sweep killed after Tune deleted a trial's superseded checkpoint and before it saved its
    state names a checkpoint that is gone: the newest older one is copied under its name (not a
    newer one, which Tune never received), and a trial whose checkpoint is there, a finished
    one, or one with nothing older is left as it is."""
    from types import SimpleNamespace

    import pyarrow.fs as fs
    import ray.tune as tune

    from iaa.platform.sweeps.trials.lost_checkpoints import mend

    def trial(name: str, named: str | None, kept: tuple[str, ...], status: str = "RUNNING") -> SimpleNamespace:
        folder = tmp_path / name
        for ckpt in kept:
            (folder / ckpt).mkdir(parents=True)
            (folder / ckpt / "checkpoint.pt").write_text(f"{name} {ckpt}")
        checkpoint = tune.Checkpoint(str(folder / named), filesystem=fs.LocalFileSystem()) if named else None
        return SimpleNamespace(trial_id=name, status=status, checkpoint=checkpoint)

    trials = [trial("lost", "checkpoint_000004", ("checkpoint_000001", "checkpoint_000002", "checkpoint_000005")),
              trial("whole", "checkpoint_000003", ("checkpoint_000001", "checkpoint_000003")),
              trial("ended", "checkpoint_000004", ("checkpoint_000002",), status="TERMINATED"),
              trial("alone", "checkpoint_000004", ("checkpoint_000005",)),
              trial("none", None, ())]
    mended = mend(trials)
    assert [(m.trial_id, m.lost, m.used) for m in mended] == [("lost", "checkpoint_000004", "checkpoint_000002")]
    assert (tmp_path / "lost" / "checkpoint_000004" / "checkpoint.pt").read_text() == "lost checkpoint_000002"
    assert not (tmp_path / "ended" / "checkpoint_000004").exists() and not (tmp_path / "alone" / "checkpoint_000004").exists()
    assert (tmp_path / "whole" / "checkpoint_000003" / "checkpoint.pt").read_text() == "whole checkpoint_000003"
