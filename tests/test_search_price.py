"""Configurations' prices (benchmarks/search/price.py): measured side by side for every configuration
of a table, read back relative to the grid's mean and refused for another table; a replayed sweep
pays each example at its configuration's price."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _faults import assert_says

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "search"))
import price  # noqa: E402
import replay  # noqa: E402
import table  # noqa: E402

GRID = {"model.steps": [1, 3], "model.embed_dim": [8, 16]}
FIXED = {"train.batch_size": 16, "model.hidden_dim": 8, "model.state_dim": 12, "model.gate_dim": 10,
         "train.precision": "fp32"}


def _write_table(path: Path, vocab_hash: str = "v1") -> table.CurveTable:
    """Two checks of half an epoch (32 examples each) per configuration of GRID."""
    rows = [{**params, "config_id": i, "check": c, "valid_acc": 0.1 * i + 0.01 * c, "best_valid_acc": 0.1 * i + 0.01 * c,
             "examples": 32 * c, "seconds": 1.0 * c, "wall_seconds": 1.5 * c, "epoch": 0.5 * c}
            for i, params in enumerate(dict(zip(GRID, v)) for v in [(1, 8), (1, 16), (3, 8), (3, 16)]) for c in (1, 2)]
    table.write_table(rows, GRID, path, {"command": "python build", "dataset": "cbt-ne", "fixed": json.dumps(FIXED),
                                         "vocab_hash": vocab_hash})
    return table.load(path)


def _write_prices(path: Path, t: table.CurveTable, rates: dict[int, float]) -> None:
    path.write_text(json.dumps({"table_metadata": {k: t.metadata.get(k) for k in price.MATCH}, "grid": t.grid,
                                "configurations": [{"config_id": i, "seconds_per_example": r}
                                                   for i, r in rates.items()]}), encoding="utf-8")


def test_a_replayed_trial_pays_its_examples_at_its_configurations_price(tmp_path: Path) -> None:
    t = _write_table(tmp_path / "curves.parquet")
    grid = replay.Strategy("grid", None, asha=False)
    plain = replay.replay(t, None, grid, 0, None, 4, 1)
    priced = replay.replay(t, None, grid, 0, None, 4, 1, price={key: 3.0 if i == 3 else 1.0
                                                                for key, i in t.config_ids.items()})
    assert plain.points[-1][:2] == pytest.approx((4.0, 4.0))           # 4 configurations x 1 epoch, one at a time
    assert priced.points[-1][:2] == pytest.approx((6.0, 6.0))          # config 3's epoch costs 3
    steps = [b[0] - a[0] for a, b in zip([(0.0,)] + priced.points, priced.points)]
    trial_of_3 = [i for i, p in enumerate(priced.proposals) if t.config_ids[t.key(p)] == 3][0]
    assert steps[2 * trial_of_3: 2 * trial_of_3 + 2] == pytest.approx([1.5, 1.5])   # its two half-epoch checks


def test_prices_read_back_relative_to_the_grid_mean(tmp_path: Path) -> None:
    t = _write_table(tmp_path / "curves.parquet")
    _write_prices(price.path_for(tmp_path / "curves.parquet"), t, {0: 1e-3, 1: 2e-3, 2: 3e-3, 3: 6e-3})
    relative = price.load(price.path_for(tmp_path / "curves.parquet"), t)
    assert price.path_for(tmp_path / "curves.parquet").name == "curves.price.json"
    assert sum(relative.values()) / 4 == pytest.approx(1.0)
    assert relative[t.key({"model.steps": 3, "model.embed_dim": 16})] == pytest.approx(2.0)   # 6e-3 / mean 3e-3


def test_prices_of_another_table_or_none_are_one_line_saying_what_to_run(tmp_path: Path) -> None:
    t = _write_table(tmp_path / "curves.parquet")
    other = _write_table(tmp_path / "other.parquet", vocab_hash="v2")
    with pytest.raises(SystemExit) as err:
        price.load(tmp_path / "none.price.json", t)
    assert_says(str(err.value), "none.price.json", "no prices", "price.py")
    _write_prices(tmp_path / "p.json", other, {0: 1e-3, 1: 1e-3, 2: 1e-3, 3: 1e-3})
    with pytest.raises(SystemExit) as err:
        price.load(tmp_path / "p.json", t)
    assert_says(str(err.value), "p.json", "another table", "vocab_hash")
    _write_prices(tmp_path / "q.json", t, {0: 1e-3, 1: 1e-3, 2: 1e-3})
    with pytest.raises(SystemExit) as err:
        price.load(tmp_path / "q.json", t)
    assert_says(str(err.value), "q.json", "no price for configurations [3]")


def test_every_configuration_of_a_table_is_priced_on_the_same_batches(tmp_path: Path) -> None:
    import torch

    from iaa.data.loading.loader import PreparedData
    from tests._tiny import make_tiny_prepared

    prepared = make_tiny_prepared(tmp_path / "data")
    vocab_hash = str(PreparedData.open(prepared).manifest.vocab_hash)
    _write_table(tmp_path / "curves.parquet", vocab_hash=vocab_hash)
    threads = torch.get_num_threads()
    try:
        assert price.main(["--table", str(tmp_path / "curves.parquet"), "--data", str(prepared),
                           "--rounds", "2", "--batches", "1"]) == 0
        with pytest.raises(SystemExit) as err:                          # data of another vocabulary
            _write_table(tmp_path / "other.parquet", vocab_hash="v2")
            price.main(["--table", str(tmp_path / "other.parquet"), "--data", str(prepared)])
    finally:
        torch.set_num_threads(threads)
    assert_says(str(err.value), str(prepared), "not the data of")
    record = json.loads((tmp_path / "curves.price.json").read_text())
    assert [r["config_id"] for r in record["configurations"]] == [0, 1, 2, 3]
    assert all(len(r["round_rates"]) == 2 and r["seconds_per_example"] > 0 for r in record["configurations"])
    assert record["configurations"][2]["model.steps"] == 3 and record["table_metadata"]["vocab_hash"] == vocab_hash
    relative = price.load(tmp_path / "curves.price.json", table.load(tmp_path / "curves.parquet"))
    assert sum(relative.values()) / 4 == pytest.approx(1.0)


SEARCH = Path(__file__).resolve().parents[1] / "benchmarks" / "search"


@pytest.mark.parametrize("name", ["curves.parquet", "curves-cbt-cn.parquet"])
def test_each_committed_table_has_prices_measured_for_it(name: str) -> None:
    t = table.load(SEARCH / name)
    relative = price.load(price.path_for(SEARCH / name), t)
    assert len(relative) == len(t.curves) and sum(relative.values()) / len(relative) == pytest.approx(1.0)
    assert max(relative.values()) / min(relative.values()) > 2          # the grids' costs differ, or nothing is priced


def test_the_search_benchmark_priced_by_cpu_time_charges_the_whole_grid_what_examples_do(tmp_path: Path) -> None:
    sys.path.insert(0, str(SEARCH.parent))
    import bench_search

    runs = {}
    for cost in ("examples", "cpu"):
        argv = ["bench_search.py", "--table", str(SEARCH / "curves-cbt-cn.parquet"), "--seeds", "2", "--trials", "8",
                "--only", "exhaustive", "random + asha", "--cost", cost, "--out", str(tmp_path), "--name", cost]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", argv)
            assert bench_search.main() == 0
        runs[cost] = json.loads((tmp_path / f"{cost}.json").read_text())
    assert runs["cpu"]["cost"] == "cpu" and runs["cpu"]["price_file"].endswith("curves-cbt-cn.price.json")
    assert runs["cpu"]["grid_epochs"] == pytest.approx(runs["examples"]["grid_epochs"])   # 32 epochs either way
    sweep = "random + asha (tune --sampler random)"
    assert runs["cpu"]["strategies"][sweep]["epochs_4_trials"] != runs["examples"]["strategies"][sweep]["epochs_4_trials"]
    for row in runs["examples"]["strategies"].values():     # every seed counts at every x: the median never rises
        median = row["regret_median"]
        assert all(later <= earlier + 1e-9 for earlier, later in zip(median, median[1:]))


def test_the_first_comparison_warning_fires_on_sweeps_that_compare_too_early_on_real_text(tmp_path: Path) -> None:
    """``report --sweep``'s own check, on replayed sweeps of the real-text table: ASHA's first
    comparison at 8,000 examples ranks worse than chance there, at 16,000 it ranks."""
    sys.path.insert(0, str(SEARCH.parent))
    import bench_first_comparison

    argv = ["bench_first_comparison.py", "--seeds", "6", "--out", str(tmp_path)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        assert bench_first_comparison.main() == 0
    early, later, _ = json.loads((tmp_path / "first-comparison.json").read_text())["schedules"].values()
    assert early["first_comparison_examples"] == 8_000 and later["first_comparison_examples"] == 16_000
    assert early["warned_share"] > 0.5 > later["warned_share"]
    assert early["spearman_median"] < 0 < later["spearman_median"]


def test_a_replayed_sweep_hands_the_report_each_trial_s_checks_up_to_where_asha_stopped_it() -> None:
    sys.path.insert(0, str(SEARCH.parent))
    import bench_first_comparison

    t = table.load(SEARCH / "curves-cbt-cn.parquet")
    configs = [dict(zip(t.grid, key)) for key in list(t.curves)[:2]]
    trace = replay.Trace(proposals=configs, stops=[(replay.TRIAL_ID.format(0), 3)])
    stopped, finished = bench_first_comparison.trials_of(trace, t)
    assert stopped.state == "PRUNED" and stopped.stopped_by_asha and list(stopped.intermediate_values) == [1, 2, 3]
    assert finished.state == "COMPLETE" and len(finished.intermediate_values) == len(t.curve(configs[1]))
    assert stopped.intermediate_values[2] == t.curve(configs[0])[1].valid_acc
