"""The sweep's cost estimate and its running time-left line."""

from __future__ import annotations

from dataclasses import replace

from _faults import as_shown, assert_says
from iaa.jobs.sweeps.cost import SweepCost, duration


def _cost(rate: float, gpus: bool = False) -> SweepCost:
    return SweepCost(trials=24, epochs=4, examples=120_000, examples_per_s=rate, concurrency=1, gpus=gpus)


def test_long_cpu_sweeps_say_how_to_shrink():
    text = as_shown(_cost(rate=20.0).describe())
    assert "24 trials x 4 epochs x 120,000 examples" in text
    one = as_shown(SweepCost(trials=1, epochs=4, examples=1000, examples_per_s=20.0, concurrency=2, gpus=False).describe())
    assert "cost: 1 trial x 4 epochs x 1,000 examples, one at a time" in one
    assert _cost(20.0).wall_s == 24 * 4 * 120_000 / 20.0
    assert "--num-samples" in text and "--max-epochs" in text and "GPU" in text
    assert "--num-samples" not in as_shown(_cost(rate=1e6).describe())
    assert "not probed" in _cost(rate=0.0, gpus=True).describe()


def test_waves_of_concurrent_trials():
    cost = SweepCost(trials=6, epochs=2, examples=1000, examples_per_s=100.0, concurrency=4, gpus=False)
    assert cost.wall_s == 2 * 2 * 1000 / 100.0          # two waves of 20 s


def test_a_small_sweep_counts_its_validation_and_start_up_not_only_its_training():
    cost = SweepCost(trials=4, epochs=1.5, examples=2000, examples_per_s=200.0, concurrency=2, gpus=False,
                     checks=3, valid_examples=500, valid_examples_per_s=500.0, start_s=20.0, trial_start_s=5.0)
    # 20 s to start, then two waves of (5 s start + 15 s training + 3 checks of 1 s)
    assert cost.wall_s == 20.0 + 2 * (5.0 + 15.0 + 3.0)
    assert_says(cost.describe(), "0m36s is not training", "3 validation check(s)", "500 examples per trial")
    assert "not training" not in _cost(20.0).describe()


def test_a_time_budget_that_ends_the_trials_before_their_first_check_is_a_warning():
    from dataclasses import replace

    cost = replace(_cost(rate=16.0), base_examples_per_s=36.0, first_check_examples=64_000, budget_s=29 * 60)
    [note] = cost.budget_notes()                         # 64,000 examples at the quicker 36/s: 29m37s
    assert_says(as_shown(note), "the sweep's time budget of 29m00s ends the trials before their first check",
                "after 64,000 training examples, about 29m37s", "--time-budget", "--set train.check_every=BATCHES")
    assert replace(cost, budget_s=30 * 60).budget_notes() == []      # the base config checks in time
    assert replace(cost, budget_s=None).budget_notes() == [] and replace(cost, first_check_examples=0).budget_notes() == []


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_console_says_each_trial_event_once_and_corrects_the_estimate_from_real_checks():
    import io

    from iaa.jobs.sweeps.console import SweepConsole

    cost = SweepCost(trials=4, epochs=2, examples=1000, examples_per_s=100.0, concurrency=2, gpus=False)
    out, clock = io.StringIO(), _Clock()
    console = SweepConsole(cost, ["train.lr", "model.steps"], say=lambda line: print(line, file=out), clock=clock)
    console.trial_started("a", {"train.lr": 0.004, "model.steps": 2})
    console.trial_started("b", {"train.lr": 0.001, "model.steps": 1})
    clock.now = 50.0
    console.trial_checked("a", {"checks": 1, "epoch": 0.5, "valid_acc": 0.6, "best_valid_acc": 0.6})
    # 0.5 epochs in 50 s: a trial takes 200 s; two waves -> 400 s, where the probe said 40 s
    assert console.corrected_s == 400.0 and cost.wall_s == 40.0
    console.trial_checked("b", {"checks": 1, "epoch": 0.5, "valid_acc": 0.5, "best_valid_acc": 0.5})
    # left: 1.5 + 1.5 epochs of a and b, 2 + 2 of the unstarted trials, two at a time at 0.01 epoch/s
    assert console.left_s() == 7 / (0.01 * 2)
    console.trial_ended("b", "asha")
    console.trial_ended("b", "asha")                      # said once
    console.trial_ended("a", "max-epochs")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[0m00s] trial a started: lr=4e-3 T=2"
    assert_says(lines[3], "estimate from the first check", "about 6m40s in all", "at most 0m40s")
    assert lines[-2] == "[0m50s] trial b stopped by ASHA after 1 check, best valid_acc 0.5000"
    assert lines[-1] == "[0m50s] trial a finished (max-epochs) after 1 check, best valid_acc 0.6000"
    assert len(lines) == 7
    assert_says(console.summary(420.0), "sweep took 7m00s", "at most 0m40s before it started",
                "about 6m40s after the first check")
    assert duration(3725) == "1h02m" and duration(65) == "1m05s"


def test_the_console_table_comes_only_after_a_quiet_spell_with_the_searched_values_as_columns():
    import io

    from iaa.jobs.sweeps.console import SweepConsole

    out, clock = io.StringIO(), _Clock()
    console = SweepConsole(None, ["train.lr", "model.steps"], say=lambda line: print(line, file=out), clock=clock, table_every_s=30)
    console.trial_started("a", {"train.lr": 0.004, "model.steps": 2})
    console.trial_started("b", {"train.lr": 0.002, "model.steps": 3})
    clock.now = 40.0
    console.tick()
    assert len(out.getvalue().splitlines()) == 2          # no trial ended yet: the check lines say it all
    console.trial_ended("b", "asha")
    clock.now = 69.0
    console.tick()
    assert len(out.getvalue().splitlines()) == 3          # not quiet long enough
    clock.now = 71.0
    console.tick()
    console.tick()                                        # at most every 30 s
    table = out.getvalue().splitlines()[3:]
    assert table[0] == "[1m11s] 1/2 trials done"
    assert table[1].split() == ["trial", "state", "checks", "valid_acc", "best", "lr", "T"]
    assert table[2].split() == ["a", "running", "0", "-", "-", "4e-3", "2"]
    assert len(table) == 4
    clock.now = 200.0
    console.tick()                                        # no trial ended since: no second table
    assert len(out.getvalue().splitlines()) == 7


def test_probe_trains_the_sweeps_model_and_measures_a_rate(tmp_path):
    """The probe runs real training steps of the configured reader (the sweep's first line uses it)."""
    from iaa.jobs.datasets import resolve
    from iaa.jobs.sweeps.cost import probe
    from tests._tiny import TINY_SETS, make_tiny_prepared

    prepared = make_tiny_prepared(tmp_path)
    cfg = resolve.job_config("cbt-ne", prepared, model_kind="iaa", config_file=None, sets=TINY_SETS)
    assert probe(cfg, prepared, threads=1) > 0
    assert probe(cfg, prepared, threads=1, split="valid") > 0


def test_the_costliest_trial_takes_every_searched_size_and_epoch_count_at_its_largest():
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.config.search_space import parse

    base = JobConfig()                                          # T 8, h 128, d 384, 10 epochs
    space = parse({"model.steps": [3, 12, 5], "model.hidden_dim": {"low": 64, "high": 256, "step": 64},
                   "model.dropout": {"low": 0.0, "high": 0.5}, "train.lr": [1e-3, 4e-3],
                   "train.max_epochs": [2.0, 10.0], "model.embed_dim": 512, "train.batch_size": [64, 16, 32]},
                  base)
    largest, raised = space.costliest(base)
    assert (largest.model.steps, largest.model.hidden_dim, largest.train.max_epochs) == (12, 256, 10.0)
    assert largest.train.batch_size == 16                       # the most steps per example
    assert largest.model.embed_dim == 512                       # the space's fixed value, which every trial gets
    assert (largest.model.dropout, largest.train.lr) == (base.model.dropout, base.train.lr)   # no cost of theirs
    assert raised == {"model.steps": 12, "model.hidden_dim": 256, "train.batch_size": 16}   # 10 epochs: the base's
    same, none = parse({"model.steps": [1, base.model.steps], "train.lr": [1e-3, 2e-3]}, base).costliest(base)
    assert same == base and none == {}                           # the base is already the costliest


def test_the_estimate_names_the_costliest_trial_it_probed_and_the_base_rate():
    cost = SweepCost(trials=24, epochs=4, examples=1000, examples_per_s=50.0, concurrency=1, gpus=False,
                     costliest="T=8 h=256", base_examples_per_s=80.0)
    text = as_shown(cost.describe())
    assert_says(text, "probe of the costliest trial", "T=8 h=256", "the base config ~80")
    assert "(probe)" in as_shown(_cost(20.0).describe())


def test_the_sweep_estimate_probes_the_costliest_trial_and_the_base(monkeypatch, tmp_path):
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.jobs.config.search_space import parse
    from iaa.jobs.ports import Placement, SearchPlan
    from iaa.jobs.tune import estimate

    probed: list[tuple[int, int, str]] = []

    def fake_probe(cfg, prepared, threads, split="train"):
        probed.append((cfg.model.steps, cfg.model.hidden_dim, split))
        return 10.0 if cfg.model.hidden_dim == 256 else 40.0

    monkeypatch.setattr(estimate, "probe", fake_probe)
    base = JobConfig()
    space = parse({"model.hidden_dim": [base.model.hidden_dim, 256], "model.steps": 2}, base)
    plan = SearchPlan(base=base, space=space, preset=TUNE_PRESETS["demo"], seed=0, num_samples=4, max_t=5)
    launch = Placement(name="s", storage=str(tmp_path), prepared=tmp_path, max_concurrent=2, threads=1,
                       gpus_per_worker=0, train_rows=1000)
    cost = estimate.estimate_cost(launch, plan, tmp_path)
    assert probed == [(2, 256, "train"), (2, 256, "valid"), (2, base.model.hidden_dim, "train")]
    assert cost.examples_per_s == 10.0 and cost.base_examples_per_s == 40.0 and cost.costliest == "h=256"
    assert cost.concurrency == 2
    # a cluster that may grow admits every trial, but today's nodes run one at a time: the time is theirs
    growing = replace(launch, max_concurrent=4, fits_now=1)
    assert estimate.estimate_cost(growing, plan, tmp_path).concurrency == 1


def _two_at_a_time(first: dict, second: dict):
    """A console of 4 trials of 2 epochs, 2 at a time, and the first two started: (console, out, clock)."""
    import io

    from iaa.jobs.sweeps.console import SweepConsole

    cost = SweepCost(trials=4, epochs=2, examples=1000, examples_per_s=100.0, concurrency=2, gpus=False)
    out, clock = io.StringIO(), _Clock()
    console = SweepConsole(cost, list(first), say=lambda line: print(line, file=out), clock=clock)
    console.trial_started("a", first)
    console.trial_started("b", second)
    return console, out, clock


def test_the_estimate_is_said_again_once_the_first_wave_checked_where_a_larger_trial_moved_it():
    console, out, clock = _two_at_a_time({"model.hidden_dim": 32}, {"model.hidden_dim": 256})
    clock.now = 10.0
    console.trial_checked("a", {"checks": 1, "epoch": 0.5, "valid_acc": 0.3})
    assert console.corrected_s == 80.0                    # 0.05 epoch/s: two waves of 40 s
    clock.now = 30.0
    console.trial_checked("a", {"checks": 2, "epoch": 1.5, "valid_acc": 0.4})
    assert console.revised_s is None                      # the large trial has not checked yet
    console.trial_checked("b", {"checks": 1, "epoch": 0.5, "valid_acc": 0.2})
    # the small trial's 0.05 epoch/s to its last check, the large one's 1/60: two waves at their mean
    assert console.revised_s == 2 * 2 / ((0.05 + 0.5 / 30) / 2)
    lines = out.getvalue().splitlines()
    assert_says(lines[-1], "first 2 trials' checks", "about 2m00s in all")
    assert console.summary(130.0).endswith("about 1m20s after the first check; about 2m00s after the first wave's")
    console.trial_checked("b", {"checks": 2, "epoch": 1.0, "valid_acc": 0.3})
    assert len(out.getvalue().splitlines()) == len(lines) + 1          # said once


def test_an_estimate_the_first_wave_confirms_is_not_said_again():
    console, out, clock = _two_at_a_time({"train.lr": 0.004}, {"train.lr": 0.002})
    clock.now = 10.0
    console.trial_checked("a", {"checks": 1, "epoch": 0.5, "valid_acc": 0.3})
    clock.now = 11.0
    console.trial_checked("b", {"checks": 1, "epoch": 0.5, "valid_acc": 0.3})    # within REVISE_BY
    assert console.revised_s == console.corrected_s
    assert not any("first 2 trials" in line for line in out.getvalue().splitlines())
    assert "first wave" not in console.summary(90.0)


def test_the_console_reads_asha_s_first_comparison_from_the_checks_it_was_told():
    from iaa.jobs.sweeps import comparison
    from iaa.jobs.sweeps.console import SweepConsole

    console = SweepConsole(None, [], say=lambda line: None, clock=_Clock())
    checks = {"a": [0.40, 0.42, 0.45], "b": [0.38, 0.45, 0.55], "c": [0.35, 0.50, 0.60], "d": [0.30], "e": [0.2, 0.3]}
    for trial, values in checks.items():
        console.trial_started(trial, {})
        for n, value in enumerate(values, start=1):
            console.trial_checked(trial, {"checks": n, "valid_acc": value})
    for trial in "abc":
        console.trial_ended(trial, "max-epochs")
    console.trial_ended("d", "asha")
    console.trial_ended("e", "error", "boom")                       # a failed trial is left out
    compared = console.first_comparison(1)
    assert compared == {"check": 1, "compared": 4, "stopped": 1, "went_on": 3, "spearman": -1.0}
    [warning] = comparison.ranked_poorly(compared)                  # the leaders at check 1 ended last
    assert_says(as_shown(warning), "ranked the 3 trials that went on past it poorly", "--grace-period 2")
    assert console.first_comparison(2)["spearman"] == 1.0 and comparison.ranked_poorly(console.first_comparison(2)) == []
