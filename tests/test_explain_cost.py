"""The sweep's cost estimate and its running time-left line."""

from __future__ import annotations

from iaa.jobs.cost import Progress, SweepCost, duration


def _cost(rate: float, gpus: bool = False) -> SweepCost:
    return SweepCost(trials=24, epochs=4, examples=120_000, examples_per_s=rate, concurrency=1, gpus=gpus)


def test_long_cpu_sweeps_say_how_to_shrink():
    text = _cost(rate=20.0).describe()
    assert "24 trials x 4 epochs x 120,000 examples" in text
    assert _cost(20.0).wall_s == 24 * 4 * 120_000 / 20.0
    assert "--num-samples" in text and "--max-epochs" in text and "GPU" in text
    assert "--num-samples" not in _cost(rate=1e6).describe()
    assert "not probed" in _cost(rate=0.0, gpus=True).describe()


def test_waves_of_concurrent_trials():
    cost = SweepCost(trials=6, epochs=2, examples=1000, examples_per_s=100.0, concurrency=4, gpus=False)
    assert cost.wall_s == 2 * 2 * 1000 / 100.0          # two waves of 20 s


def test_time_left_follows_the_rate_seen():
    cost = SweepCost(trials=4, epochs=2, examples=1000, examples_per_s=100.0, concurrency=2, gpus=False)
    progress = Progress(cost, every_s=0)
    progress.update("a", epoch=1.0)
    progress.update("b", epoch=1.0)
    # 2 epochs done in 10 s; left: 1 + 1 for a and b, 2 + 2 for the two unstarted trials.
    assert progress.left_s(10.0) == 6 / (2 / 10.0)
    progress.update("a", ended=True)                   # ASHA stopped it: its last epoch is not owed
    assert progress.left_s(10.0) == 5 / (2 / 10.0)
    assert "1/4 trials done" in progress.line(10.0)
    assert duration(3725) == "1h02m" and duration(65) == "1m05s"


def test_probe_trains_the_sweeps_model_and_measures_a_rate(tmp_path):
    """The probe runs real training steps of the configured reader (the sweep's first line uses it)."""
    from iaa.jobs import resolve
    from iaa.jobs.cost import probe
    from tests._tiny import TINY_SETS, make_tiny_prepared

    prepared = make_tiny_prepared(tmp_path)
    cfg = resolve.job_config("cbt-ne", prepared, model_kind="iaa", config_file=None, sets=TINY_SETS)
    assert probe(cfg, prepared, threads=1) > 0
