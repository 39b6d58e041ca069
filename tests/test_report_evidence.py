"""``benchmarks/evidence/evidence.py``: argument parsing and the commands each study plans (nothing runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "evidence" / "evidence.py"


@pytest.fixture(scope="module")
def evidence():
    spec = importlib.util.spec_from_file_location("evidence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["evidence"] = module       # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("evidence", None)


def _plan(evidence, *argv: str):
    args = evidence.parser().parse_args(list(argv))
    return evidence.PLANS[args.study](args)


def _set_args(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]


def test_curves_trains_the_three_models_at_once_with_one_config(evidence) -> None:
    prepare, train, report = _plan(evidence, "curves", "--minutes", "7", "--workdir", "w")
    assert len(prepare) == 1 and "prepare" in prepare[0]
    assert sorted(cmd[cmd.index("--model") + 1] for cmd in train) == sorted(evidence.MODELS)
    assert len({tuple(_set_args(cmd)) for cmd in train}) == 1           # same config and budget for all
    assert "train.max_minutes=7.0" in _set_args(train[0]) and "train.threads=1" in _set_args(train[0])
    assert report[0][report[0].index("report") + 1:][:2] == ["--experiment", "train-cbt-cn"]


def test_ensemble_trains_seeds_in_pairs_then_ensembles_them(evidence) -> None:
    plan = _plan(evidence, "ensemble", "--seeds", "5", "--parallel", "2", "--workdir", "w")
    trains = plan[1:-2]
    assert [len(step) for step in trains] == [2, 2, 1]
    seeds = [s for step in trains for cmd in step for s in _set_args(cmd) if s.startswith("train.seed=")]
    assert seeds == [f"train.seed={i}" for i in range(5)]
    run_dirs = [cmd[cmd.index("--run-dir") + 1] for step in trains for cmd in step]
    for step, select in zip(plan[-2:], ("all", "greedy")):
        cmd = step[0]
        members = cmd[cmd.index("--members") + 1 : cmd.index("--select")]
        assert members == [f"{d}/checkpoints/best.pt" for d in run_dirs]
        assert cmd[cmd.index("--select") + 1] == select


def test_search_runs_the_whole_demo_grid_in_pairs_then_each_sweep_seed(evidence) -> None:
    from iaa.jobs.config.search_space import DEMO_GRID

    plan = _plan(evidence, "search", "--tune-samples", "6", "--sweep-seeds", "0", "1", "2", "--epochs", "2")
    assert "prepare" in plan[0][0]                      # the demo data is made once, before runs share it
    grid_steps = [step for step in plan[1:] if "train" in step[0]]
    grid_cmds = [cmd for step in grid_steps for cmd in step]
    tune_cmds = [step[0] for step in plan if "tune" in step[0]]
    size = 1
    for choices in DEMO_GRID.values():
        size *= len(choices)
    assert len(grid_cmds) == size == len({tuple(_set_args(c)) for c in grid_cmds})
    assert [len(step) for step in grid_steps] == [2] * (size // 2)
    assert all("train.max_epochs=2.0" in _set_args(c) for c in grid_cmds)
    assert [c[c.index("--seed") + 1] for c in tune_cmds] == ["0", "1", "2"]
    assert all(c[c.index("--num-samples") + 1] == "6" and c[c.index("--max-epochs") + 1] == "2.0" for c in tune_cmds)
    assert not any("--search-space" in c for c in tune_cmds)


def test_search_over_a_yaml_space_grids_its_choices_and_tunes_the_same_space(evidence, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("train.lr: [0.001, 0.004]\nmodel.steps: [2, 3, 4]\nmodel.embed_dim: 32\n")
    plan = _plan(evidence, "search", "--space", str(space), "--sweep-seeds", "7")
    grid_cmds = [cmd for step in plan[1:] for cmd in step if "train" in cmd]
    assert len(grid_cmds) == 6 and all("model.embed_dim=32" in _set_args(c) for c in grid_cmds)
    tune = [step[0] for step in plan if "tune" in step[0]][0]
    assert tune[tune.index("--search-space") + 1] == str(space)
    space.write_text("train.lr: {low: 0.001, high: 0.004}\n")
    with pytest.raises(SystemExit, match="needs choices"):
        _plan(evidence, "search", "--space", str(space))


def test_search_passes_asha_settings_and_can_add_sweeps_beside_an_existing_grid(evidence) -> None:
    plan = _plan(evidence, "search", "--tune-only", "--grace-period", "1", "--reduction-factor", "3",
                 "--label", "g1", "--sweep-seeds", "0", "1")
    assert all(len(step) == 1 and "tune" in step[0] for step in plan) and len(plan) == 2
    cmd = plan[0][0]
    assert cmd[cmd.index("--grace-period") + 1] == "1" and cmd[cmd.index("--reduction-factor") + 1] == "3.0"
    assert [step[0][step[0].index("--name") + 1] for step in plan] == ["demo-tune-g1-seed0", "demo-tune-g1-seed1"]


def test_compute_counts_overlapping_runs_once_each_and_best_only_grows(evidence) -> None:
    T = evidence.Trace
    # two runs side by side from t=0, a third after them: checks at (time, accuracy)
    runs = [T(0.0, ((10.0, 0.5), (20.0, 0.6))), T(0.0, ((15.0, 0.7),)), T(20.0, ((30.0, 0.65),))]
    x, y = evidence.best_against_compute(runs)
    assert x == [10.0 + 10.0, 15.0 + 15.0, 20.0 + 15.0, 20.0 + 15.0 + 10.0]
    assert y == [0.5, 0.7, 0.7, 0.7]
    assert all(b >= a for a, b in zip(x, x[1:])) and all(b >= a for a, b in zip(y, y[1:]))


def test_dry_run_prints_and_runs_nothing(evidence, capsys, monkeypatch) -> None:
    monkeypatch.setattr(evidence.subprocess, "Popen", lambda *a, **k: pytest.fail("a dry run started a command"))
    evidence.main(["curves", "--dry-run"])
    out = capsys.readouterr().out
    assert out.count("iaa-cli train") == 3 and "iaa-cli report" in out


def test_bad_arguments_are_refused(evidence) -> None:
    with pytest.raises(SystemExit):
        evidence.parser().parse_args(["grid"])
    with pytest.raises(SystemExit):
        evidence.parser().parse_args(["ensemble", "--seeds", "five"])


def test_anytime_curves_come_from_the_tracked_runs(evidence, tmp_path: Path) -> None:
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import store as tracking

    uri = Workdir(tmp_path).tracking_uri()

    def log(experiment: str, accs: list[float], parent: str | None = None) -> None:
        run = tracking.Run.start(uri, experiment, "r", parent_run_id=parent)
        for step, acc in enumerate(accs, 1):
            run.log_metrics({"valid_acc": acc}, step=step)
        run.end()

    for accs in ([0.5, 0.6], [0.7], [0.65]):
        log("train-demo", accs)
    sweep = tracking.Run.start(uri, "tune-demo", "demo-tune-seed0")
    sweep.end()
    for accs in ([0.2], [0.695]):
        log("tune-demo", accs, parent=sweep.run_id)
    other = tracking.Run.start(uri, "tune-demo", "demo-tune-g1-seed0")   # another setting: drawn with --label g1
    other.end()
    log("tune-demo", [0.3], parent=other.run_id)
    result = evidence.anytime(str(tmp_path), str(tmp_path / "any.png"))
    assert set(result["curves"]) == {"grid", sweep.run_id}
    assert set(evidence.anytime(str(tmp_path), str(tmp_path / "g1.png"), "g1")["curves"]) == {"grid", other.run_id}
    assert result["grid_best"] == 0.7
    grid, tune = result["curves"]["grid"], result["curves"][sweep.run_id]
    assert grid["best"] == 0.7 and tune["best"] == 0.695           # 0.695 is within 1 point of 0.7
    assert grid["trial_seconds"] == result["grid_trial_seconds"] > 0
    assert tune["seconds_to_within_1_point"] is not None and tune["fraction_of_grid"] is not None
    assert (tmp_path / "any.png").read_bytes()[:4] == b"\x89PNG"


def test_converge_trains_iaa_and_the_as_reader_at_the_preset_and_resumes_both(evidence) -> None:
    prepare, train, report = _plan(evidence, "converge", "--workdir", "w")
    assert "prepare" in prepare[0]
    assert sorted(cmd[cmd.index("--model") + 1] for cmd in train) == ["as-reader", "iaa"]
    assert all(_set_args(cmd) == ["train.seed=0", "train.threads=1"] for cmd in train)   # the preset's schedule
    assert "--resume" not in train[0] and report[0][-3:] == ["--out", "docs/curves-cbt-cn-converge.png", "--json"]
    train, _ = _plan(evidence, "converge", "--workdir", "w", "--resume", "--minutes", "90")
    assert all(cmd[-1] == "--resume" and "train.max_minutes=90.0" in _set_args(cmd) for cmd in train)
