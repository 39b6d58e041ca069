"""The table of learning curves (benchmarks/search): the writer and reader keep columns, metadata
and order, a configuration is found by its values however they are typed, and the build trains a
tiny grid, resumes where it stopped and refuses parts of another plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from _faults import assert_says

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "search"))
import build_table  # noqa: E402
import figures  # noqa: E402
import late  # noqa: E402
import table  # noqa: E402

GRID = {"train.lr": [1e-3, 4e-3], "model.steps": [1, 3]}


def _rows() -> list[dict]:
    """Two checks of each configuration of GRID, written out of order."""
    rows = []
    for config_id, params in enumerate(build_table.configurations(GRID)):
        for check in (2, 1):
            acc = 0.1 * config_id + 0.01 * check
            rows.append({**params, "config_id": config_id, "check": check, "valid_acc": acc, "best_valid_acc": acc,
                         "examples": 64 * check, "seconds": 1.5 * check, "wall_seconds": 2.0 * check,
                         "epoch": 0.5 * check})
    return rows


def test_written_table_reads_back_with_its_grid_metadata_and_curves(tmp_path: Path) -> None:
    path = tmp_path / "curves.parquet"
    table.write_table(_rows(), GRID, path, {"command": "python build", "cpu": "some CPU"})
    raw = pq.read_table(path)
    assert raw.column_names == [*GRID, *table.CHECK_COLUMNS]
    assert raw.schema.field("model.steps").type == "int32" and raw.schema.field("train.lr").type == "double"
    assert raw.column("config_id").to_pylist() == [0, 0, 1, 1, 2, 2, 3, 3]      # sorted by config, check
    t = table.load(path)
    assert t.grid == GRID and t.metadata["command"] == "python build" and t.metadata["cpu"] == "some CPU"
    assert len(t.curves) == 4
    curve = t.curve({"train.lr": 4e-3, "model.steps": 3})
    assert [c.check for c in curve] == [1, 2] and t.config_ids[t.key({"train.lr": 4e-3, "model.steps": 3})] == 3
    assert curve[1] == table.Check(check=2, valid_acc=pytest.approx(0.32), best_valid_acc=pytest.approx(0.32),
                                   examples=128, seconds=3.0, wall_seconds=4.0, epoch=1.0)


def test_a_configuration_is_found_by_its_values_whatever_their_type(tmp_path: Path) -> None:
    path = tmp_path / "curves.parquet"
    table.write_table(_rows(), GRID, path, {"command": "python build"})
    t = table.load(path)
    same = [{"train.lr": 0.004, "model.steps": 3}, {"train.lr": np.float64(4e-3), "model.steps": np.int64(3)},
            {"train.lr": 0.002 * 2, "model.steps": 3.0, "model.dropout": 0.5}]   # extra keys are ignored
    assert all(t.curve(p) == t.curve(same[0]) for p in same)
    with pytest.raises(KeyError, match="not a configuration"):
        t.curve({"train.lr": 2e-3, "model.steps": 3})
    with pytest.raises(KeyError, match="model.steps"):
        t.curve({"train.lr": 4e-3})


def test_a_file_without_the_grid_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.parquet"
    table.write_table(_rows(), GRID, path, {"command": "python build"})
    raw = pq.read_table(path)
    pq.write_table(raw.replace_schema_metadata({}), path)
    with pytest.raises(ValueError, match="not a curve table"):
        table.load(path)


def test_a_table_thinned_to_every_second_check_keeps_those_checks_renumbered(tmp_path: Path) -> None:
    import replay

    path = tmp_path / "curves.parquet"
    rows = [{**r, "valid_acc": 0.5 - r["valid_acc"], "best_valid_acc": 0.5} for r in _rows()]   # falling curves
    table.write_table(rows, GRID, path, {"command": "python build"})
    thinned = replay.every(table.load(path), 2)
    curve = thinned.curve({"train.lr": 4e-3, "model.steps": 3})                 # config 3: 0.19, then 0.18
    assert [(c.check, c.examples) for c in curve] == [(1, 128)]
    assert curve[0].valid_acc == pytest.approx(0.18) == curve[0].best_valid_acc   # the best of the checks kept
    assert thinned.config_ids == table.load(path).config_ids


def test_a_missing_table_is_one_line_naming_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        table.load(tmp_path / "curves.parquet")
    assert_says(str(err.value), str(tmp_path / "curves.parquet"), "no curve table", "build_table.py")


def test_a_line_cut_short_by_a_kill_loses_only_its_own_configuration(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.jsonl"
    build_table.append_part(path, {"config_id": 0, "rows": []})
    with open(path, "a") as f:
        f.write('{"config_id": 1, "ro')                                     # killed while writing
    build_table.append_part(path, {"config_id": 2, "rows": []})
    assert sorted(build_table.read_parts(tmp_path, "ours")) == [0, 2]


def test_a_line_of_another_plan_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / "worker-1.jsonl"
    build_table.append_part(path, {"config_id": 0, "rows": [1], "plan": "ours"})
    build_table.append_part(path, {"config_id": 0, "rows": [2], "plan": "theirs"})  # a stray worker of another build
    build_table.append_part(path, {"config_id": 3, "rows": [3], "plan": "theirs"})
    done = build_table.read_parts(tmp_path, "ours")
    assert sorted(done) == [0] and done[0]["rows"] == [1]


def test_rank_correlations_of_known_rankings() -> None:
    a, b = [1, 2, 3, 4], [0.1, 0.3, 0.2, 0.4]                               # one swapped pair
    assert figures.spearman(a, b) == pytest.approx(0.8)                     # 1 - 6 * 2 / (4 * 15)
    assert figures.kendall_tau_b(a, b) == pytest.approx(4 / 6)              # 5 concordant, 1 discordant
    assert figures.spearman(a, a[::-1]) == pytest.approx(-1) and figures.kendall_tau_b(a, a) == pytest.approx(1)
    assert list(figures.ranks([0.2, 0.1, 0.2])) == [2.5, 1.0, 2.5]            # ties share their mean rank


def test_key_figures_of_a_table(tmp_path: Path) -> None:
    path = tmp_path / "curves.parquet"
    table.write_table(_rows(), GRID, path, {"command": "python build", "cpu": "some CPU"})
    f = figures.key_figures(table.load(path))
    assert f["configs"] == 4 and f["checks_per_config"] == [2] and f["cpu"] == "some CPU"
    assert f["best_valid_acc"]["best"] == pytest.approx(0.32) and f["best_valid_acc"]["worst"] == pytest.approx(0.02)
    assert f["rank_vs_last_check"]["check_1"]["spearman"] == pytest.approx(1.0)
    assert f["main_effects"] == {"train.lr": {"0.001": pytest.approx(0.07), "0.004": pytest.approx(0.27)},
                                 "model.steps": {"1": pytest.approx(0.12), "3": pytest.approx(0.22)}}


def _crossing(path: Path, first: dict[int, float], last: dict[int, float]) -> table.CurveTable:
    """GRID's four configurations, checked at 100 and 300 examples with these accuracies by config id."""
    rows = [{**params, "config_id": i, "check": check, "valid_acc": acc, "best_valid_acc": acc,
             "examples": examples, "seconds": 1.0, "wall_seconds": 1.0, "epoch": 1.0}
            for i, params in enumerate(build_table.configurations(GRID))
            for check, examples, acc in ((1, 100, first[i]), (2, 300, last[i]))]
    table.write_table(rows, GRID, path, {"command": "python build"})
    return table.load(path)


def test_a_late_rung_names_the_best_that_an_early_one_stops(tmp_path: Path) -> None:
    # config 3 leads at 100 examples; config 0, last there, ends best: keeping a half at 100 stops it
    t = _crossing(tmp_path / "long.parquet", {0: 0.20, 1: 0.30, 2: 0.35, 3: 0.40}, {0: 0.60, 1: 0.45, 2: 0.50, 3: 0.55})
    f = late.late_figures(t, [100, 300], keep=2)
    early, end = f["rungs_vs_last"]["100"], f["rungs_vs_last"]["300"]
    assert early["best"] == "lr=0.004 T=3" and early["best_regret_at_last_rung_pts"] == pytest.approx(5.0)
    assert early["kept"] == ["lr=0.004 T=3", "lr=0.004 T=1"] and early["kept_holds_last_best"] is False
    assert early["spearman"] == pytest.approx(-0.2)
    assert end["best"] == "lr=0.001 T=1" and end["kept_holds_last_best"] is True and end["spearman"] == 1.0
    assert f["per_config"][0]["valid_acc_100"] == 0.2 and f["per_config"][0]["examples_300"] == 300
    assert f["per_config"][3]["params"] == {"train.lr": 4e-3, "model.steps": 3}
    assert isinstance(f["per_config"][3]["params"]["model.steps"], int)
    curve = next(iter(t.curves.values()))
    assert late.at_examples(curve, 101).examples == 100 and late.at_examples(curve, 102).examples == 300  # within 1%

    # the same configurations on other data, one point apart at the first rung
    short = _crossing(tmp_path / "short.parquet", {0: 0.21, 1: 0.31, 2: 0.34, 3: 0.41}, {0: 0, 1: 0, 2: 0, 3: 0})
    against = late.late_figures(t, [100, 300], keep=2, short=short)["short_table"]
    assert against["configurations"] == 4 and against["mean_abs_diff_pts"] == pytest.approx(1.0)
    assert against["spearman_between_tables"] == 1.0
    with pytest.raises(SystemExit) as stopped:
        late.late_figures(t, [100, 400], keep=2)
    assert_says(str(stopped.value), "ends at 300 examples, before the rung at 400")


@pytest.mark.slow
def test_the_build_trains_a_tiny_grid_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    import torch

    from tests._tiny import TINY_SETS, make_tiny_prepared

    prepared = make_tiny_prepared(tmp_path / "data")
    sets = [s for s in TINY_SETS if not s.startswith(("model.steps", "train.max_epochs", "train.check_every"))]
    args = ["--data", str(prepared), "--dataset", "cbt-ne", "--train-rows", "96", "--grid", json.dumps(GRID),
            "--parts", str(tmp_path / "parts"), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t.parquet"),
            *[f"--set={s}" for s in sets], "--set", "train.max_epochs=1.0", "--set", "train.check_every=2"]
    threads = torch.get_num_threads()
    try:
        build_table.main([*args, "--limit", "1"])
        plan = json.loads((tmp_path / "parts" / "plan.json").read_text())["fingerprint"]
        first = build_table.read_parts(tmp_path / "parts", plan)
        build_table.main([*args, "--limit", "2"])
    finally:
        torch.set_num_threads(threads)
    done = build_table.read_parts(tmp_path / "parts", plan)
    assert len(first) == 1 and len(done) == 2 and done[next(iter(first))] == next(iter(first.values()))
    assert not build_table.read_parts(tmp_path / "parts", "another plan")

    t = table.load(tmp_path / "t.parquet")
    assert t.grid == GRID and len(t.curves) == 2
    for key, curve in t.curves.items():
        assert [c.check for c in curve] == [1, 2, 3]              # 6 batches of 16, a check every 2
        assert [c.examples for c in curve] == [32, 64, 96] and curve[-1].epoch == 1.0
        assert all(0 < a.seconds < b.seconds <= b.wall_seconds for a, b in zip(curve, curve[1:]))
        assert [c.best_valid_acc for c in curve] == list(np.maximum.accumulate([c.valid_acc for c in curve]))
        assert t.curve(dict(zip(t.grid, key))) is curve
    meta = t.metadata
    assert meta["command"].startswith("python ") and "--limit 2" in meta["command"]
    assert json.loads(meta["dataset_size"])["train"] == 96 and meta["dataset"] == "cbt-ne"
    assert meta["torch"] == torch.__version__ and meta["cpu"] and meta["date"] and meta["seed"] == "0"

    with pytest.raises(SystemExit, match="another plan"):                   # other settings, same parts
        build_table.main([*args, "--limit", "2", "--train-rows", "64"])


def test_the_committed_late_ranking_figures_are_those_of_the_committed_tables() -> None:
    """docs/search-late-cbt-cn.json, which docs/search.md quotes, says what late.py reads from the
    committed tables now."""
    search = Path(__file__).resolve().parents[1] / "benchmarks" / "search"
    said = json.loads((Path(__file__).resolve().parents[1] / "docs" / "search-late-cbt-cn.json").read_text())
    again = late.late_figures(table.load(search / "curves-cbt-cn-long.parquet"), said["rungs"], said["keep"],
                              table.load(search / "curves-cbt-cn.parquet"))
    assert again["rungs_vs_last"] == said["rungs_vs_last"] and again["short_table"] == said["short_table"]
    assert said["rungs_vs_last"]["64000"]["kept_holds_last_best"] is True
