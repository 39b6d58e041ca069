"""Handoffs between commands: tune's data checked before any work, best_config.yaml that `train`
takes as it is, and a bad start that fails at once, before Ray or MLflow is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from _faults import as_shown, assert_says
from fakes import sweep_plan
from _shared import REPO
from iaa import cli
from iaa.data.datasets import CLOZE_STYLES
from iaa.jobs.datasets import resolve
from iaa.jobs.ports import TrialRecord
from iaa.jobs.evaluation import frequency
from iaa.jobs.tune import tune
from iaa.jobs.config.job_config import JobConfig, load, read_handoff
from iaa.jobs.config.presets import TUNE_PRESETS, for_dataset
from tests._tiny import TINY_SETS, make_tiny_prepared

HEAVY = ("ray", "mlflow", "optuna", "torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _cli_in_process(args: list[str]) -> subprocess.CompletedProcess:
    """``iaa-cli ARGS`` in a fresh interpreter that prints, last on stdout, which heavy packages it loaded."""
    code = ("import sys; from iaa import cli; sys.argv = ['iaa-cli', *sys.argv[1:]]\n"
            "try:\n    cli.main()\nfinally:\n"
            f"    print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("args, code", [
    (["tune", "--dataset", "cnn"], 1),                       # not prepared
    (["tune", "--dataset", "demo", "--max-epochs", "0"], 2),  # a bad flag
    (["tune"], 2),                                           # no data at all
])
def test_a_bad_start_of_tune_is_one_line_before_ray_mlflow_or_torch_load(args: list[str], code: int,
                                                                          tmp_path: Path) -> None:
    out = _cli_in_process([*args, "--workdir", str(tmp_path / "w")])
    assert out.returncode == code, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    if code == 1:
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("Error: ")
        assert "iaa-cli prepare --dataset cnn" in out.stderr


def test_tune_takes_the_dataset_from_the_manifest_of_data(tiny: Path, tmp_path: Path) -> None:
    plan = tune.settle(tune.TuneRequest(data=tiny, workdir=tmp_path))
    assert plan.dataset == "cbt-ne" and plan.data == tiny and plan.prepared == tiny
    assert plan.name.startswith("cbt-ne-iaa-") and plan.folder == tmp_path / "sweeps" / plan.name


def test_tune_refuses_a_dataset_that_contradicts_the_manifest_in_one_line(tiny: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.cli, ["tune", "--data", str(tiny), "--dataset", "cnn",
                                          "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 1
    assert result.output.strip() == (f"Error: {tiny / 'manifest.json'}: the folder holds cbt-ne, not cnn; leave out "
                                     "--dataset (it comes from the manifest) or give --dataset cbt-ne")
    assert not (tmp_path / "w").exists()                      # no work began: no folder, no store


def test_every_style_make_cloze_writes_can_be_tuned() -> None:
    choices = next(p for p in cli.tune.params if p.name == "dataset").type.choices
    for style in CLOZE_STYLES:
        assert style in choices and style in TUNE_PRESETS
        assert tune.asha_preset(tune.TuneRequest(dataset=style)).num_samples >= 1


def _best_record(tiny: Path, trial_epochs: float) -> TrialRecord:
    cfg = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, f"train.max_epochs={trial_epochs}"))
    return TrialRecord(trial_id="t_00001", config=cfg, params={"model.steps": 2}, best_valid_acc=0.3125,
                       checkpoint="/nowhere/best.pt")


def test_best_config_keeps_the_data_and_the_trial_budget_apart_from_the_training_length(tiny: Path,
                                                                                       tmp_path: Path) -> None:
    best = _best_record(tiny, trial_epochs=0.5)
    path = tmp_path / "best_config.yaml"
    tune.write_best_config(best, path, "s1", train_epochs=2.0, data=tiny)
    handoff = read_handoff(path)
    assert handoff["data"] == str(tiny.resolve())
    assert handoff["sweep"] == {"name": "s1", "trial": "t_00001", "best_valid_acc": 0.3125, "trial_max_epochs": 0.5}
    cfg = load(JobConfig(), path)                             # the handoff keys are not config keys
    assert cfg == replace(best.config, train=replace(best.config.train, max_epochs=2.0))
    raw = yaml.safe_load(path.read_text())
    assert raw["train"]["max_epochs"] == 2.0 and raw["dataset"] == "cbt-ne"


def test_best_config_keeps_the_precision_as_the_sweep_was_given_it(tiny: Path, tmp_path: Path) -> None:
    best = _best_record(tiny, trial_epochs=0.5)
    best = replace(best, config=replace(best.config, train=replace(best.config.train, precision="bf16")))
    for configured in ("auto", "fp32"):                       # auto: decided again where the file trains
        path = tmp_path / f"{configured}.yaml"
        tune.write_best_config(best, path, "s1", train_epochs=2.0, data=tiny, precision=configured)
        assert load(JobConfig(), path).train.precision == configured


def test_best_config_of_a_dataset_sweep_names_the_dataset_only(tiny: Path, tmp_path: Path) -> None:
    path = tmp_path / "best_config.yaml"
    tune.write_best_config(_best_record(tiny, 0.5), path, "s1", train_epochs=2.0, data=None)
    assert "data" not in read_handoff(path) and yaml.safe_load(path.read_text())["dataset"] == "cbt-ne"


def test_a_sweeps_best_config_trains_in_a_run_folder_of_its_own(tmp_path: Path) -> None:
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.datasets import resolve

    cfg = JobConfig(dataset="demo")
    assert resolve.run_dir("demo", cfg, None, tmp_path).name == "demo-iaa-seed0"
    assert resolve.run_dir("demo", cfg, None, tmp_path, sweep="demo-iaa-77332e").name == "demo-iaa-77332e-best-seed0"
    assert resolve.run_dir("demo", cfg, tmp_path / "mine", tmp_path, sweep="s") == tmp_path / "mine"


def test_the_next_commands_start_with_training_the_best_config_in_the_same_workdir(tmp_path: Path) -> None:
    best = TrialRecord(trial_id="t1", config=JobConfig(), checkpoint="/w/best.pt")
    plan = sweep_plan(tmp_path / "my work", options={"workdir": str(tmp_path / "my work"),
                                                     "tracking_uri": "sqlite:////s/m.db"})
    lines = as_shown(tune.next_commands(plan, best, tmp_path / "my work" / "b.yaml")).splitlines()
    work = f"'{tmp_path / 'my work'}'"
    assert lines[1] == f"  iaa-cli train --config '{tmp_path / 'my work' / 'b.yaml'}' --workdir {work} " \
                       "--tracking-uri sqlite:////s/m.db"
    assert lines[2] == f"  iaa-cli report --sweep demo-iaa-abc123 --workdir {work}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_with_only_best_config_trains_it_on_the_sweeps_data_to_its_early_stop(tiny: Path,
                                                                                    tmp_path: Path) -> None:
    path = tmp_path / "best_config.yaml"
    tune.write_best_config(_best_record(tiny, trial_epochs=0.5), path, "s1", train_epochs=3.0, data=tiny)
    result = CliRunner().invoke(cli.cli, ["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 0, result.output
    assert ("training the best configuration of sweep s1 (trial t_00001: valid accuracy 0.3125 in at most 0.5 "
            "epochs) to its early stop: up to 3 epochs") in result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["baseline_valid_acc"] == frequency.run(tiny, "valid").accuracy
    assert out["stop_reason"] in ("early-stopped", "max-epochs")
    assert out["steps"] > 0.5 * 192 / 16                       # beyond the trial's budget
    assert Path(out["run_dir"]) == tmp_path / "w" / "runs" / "s1-best-seed0"      # apart from a plain run


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (the platform reuses a Ray already started in the process)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


def _printed_next_commands(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = lines.index("next:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("  iaa-cli ")]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_next_command_tune_prints_runs_as_printed(tiny: Path, tmp_path: Path, local_ray: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    from tests._platform import write_space

    work = tmp_path / "my work"        # a space: every printed line must quote its paths
    sets = [arg for s in TINY_SETS for arg in ("--set", s)]
    tuned = CliRunner().invoke(cli.cli, ["tune", "--data", str(tiny), "--num-samples", "2", "--max-epochs", "1",
                                         "--search-space", str(write_space(tmp_path)), "--name", "hand",
                                         "--workdir", str(work), *sets])
    assert tuned.exit_code == 0, tuned.output
    base = frequency.run(tiny, "valid").accuracy
    assert f"(most-frequent-candidate baseline {base:.4f}" in tuned.stderr
    commands = _printed_next_commands(tuned.stderr)
    assert [shlex.split(c)[1] for c in commands] == ["train", "report", "ensemble", "serve"]

    # serve runs until stopped: the printed flags must give a model that loads and answers; the
    # Ray Serve deployment itself is tested in test_serve.py
    from iaa.platform import ray_serve, serve_life

    served = []
    monkeypatch.setattr(serve_life, "check_port", lambda cfg: None)     # nothing listens: any port will do
    monkeypatch.setattr(ray_serve, "run_forever", lambda cfg, code: served.append(code.load(cfg.source, cfg.threads)))
    ensemble_commands: list[str] = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "iaa-cli"
        result = CliRunner().invoke(cli.cli, argv[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        if argv[1] == "train":                       # the best config, on the sweep's data, past the trial budget
            assert "to its early stop: up to 2 epochs" in result.stderr
            assert "best_valid_acc: " in result.stdout and (work / "runs").is_dir()
        if argv[1] == "ensemble":
            ensemble_commands = _printed_next_commands(result.stderr)
    [answerer] = served
    assert answerer.predictor is not None

    # and what the ensemble prints next, as printed: serve it, evaluate a member, distill it
    assert [shlex.split(c)[1] for c in ensemble_commands] == ["serve", "evaluate", "distill"]
    for command in ensemble_commands:
        result = CliRunner().invoke(cli.cli, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
    assert len(served) == 2 and served[1].predictor is not None


def test_an_accuracy_is_shown_beside_the_baseline_and_not_being_above_it_is_said() -> None:
    assert frequency.beside(0.5, 0.364) == "0.5000 (most-frequent-candidate baseline 0.3640)"
    assert frequency.beside(0.2955, 0.364).endswith("baseline 0.3640, and not above it)")
    assert frequency.below_warning(0.5, 0.364, "the run") == []
    [warning] = frequency.below_warning(0.2955, 0.364, "the best trial t1")
    assert warning.startswith("the best trial t1's valid accuracy 0.2955 is not above the most-frequent-candidate")


def test_asha_settings_that_can_never_stop_a_trial_are_a_warning() -> None:
    from iaa.jobs.config import search_space as spaces
    from iaa.jobs.config.presets import max_checks

    preset = TUNE_PRESETS["demo"]
    demo = replace(JobConfig(), train=replace(JobConfig().train, check_every=0))
    space = spaces.parse(preset.space, demo)

    def reachable(epochs: float) -> int:
        return max_checks(replace(demo, train=replace(demo.train, max_epochs=epochs)), space, 4096, 1) - 1

    [note] = tune.asha_notes(reachable(0.3), preset)          # --max-epochs 0.3: one check, grace 2
    assert note.startswith("ASHA can never stop a trial early: a trial makes at most 1 validation check(s)")
    assert "--grace-period" not in as_shown(note).split("give ")[-1]
    assert tune.asha_notes(reachable(1.0), preset) != []        # two checks: the grace rung is the last
    assert tune.asha_notes(reachable(1.5), preset) == []        # the quick start: three checks
    assert tune.asha_notes(reachable(1.0), replace(preset, grace_period=1)) == []


def test_asha_is_told_the_checks_a_trial_makes_where_an_epoch_splits_unevenly() -> None:
    from iaa.jobs.config import search_space as spaces
    from iaa.jobs.config.presets import max_checks

    preset = TUNE_PRESETS["demo"]
    demo = replace(JobConfig(), train=replace(JobConfig().train, check_every=0, max_epochs=preset.max_epochs))
    space = spaces.parse(preset.space, demo)
    # 20,000 rows: 625 batches an epoch, checks at batches 312 and 625, and 1.5 epochs end on the
    # third at step 937. Counted by steps between checks (312), 937 steps looked like four.
    assert max_checks(demo, space, 20_000, 1) == 3 + 1
    assert max_checks(demo, spaces.parse({**preset.space, "train.max_epochs": [1.5, 3.0]}, demo), 20_000, 1) == 6 + 1
    assert max_checks(demo, spaces.parse({**preset.space, "train.batch_size": 64}, demo), 20_000, 1) == 3 + 1


def test_asha_that_first_compares_trials_of_real_text_too_early_is_a_warning() -> None:
    from iaa.jobs.config import search_space as spaces
    from iaa.jobs.config.presets import examples_per_check
    from iaa.jobs.tune.settle import early_comparison_notes

    cbt = replace(JobConfig(), train=replace(JobConfig().train, check_every=250, batch_size=32))
    space = spaces.parse({"model.steps": [1, 4], "train.batch_size": [16, 32]}, cbt)
    per_check = examples_per_check(cbt, space, 64_000, 1)
    assert per_check == 250 * 16                              # the smallest batch the space holds
    assert examples_per_check(cbt, space, 64_000, 2) == 2 * per_check   # a check's batch on each worker

    [note] = early_comparison_notes("cbt-cn", 1, per_check, 64_000)
    assert_says(as_shown(note), "after 4,000 training examples", "worse than chance", "--grace-period 4",
                "after 16,000")
    assert early_comparison_notes("cbt-cn", 4, per_check, 64_000) == []          # 16,000: late enough
    assert early_comparison_notes("demo", 1, per_check, 64_000) == []            # generated text learns at once
    assert early_comparison_notes("cbt-cn", 1, per_check, 12_000) == []          # no later comparison to wait for
    preset = TUNE_PRESETS["cbt-cn"]                      # the preset's own checks: every 2,000 batches of 32
    assert early_comparison_notes("cbt-cn", preset.grace_period, examples_per_check(
        for_dataset("cbt-cn"), spaces.parse(preset.space, for_dataset("cbt-cn")), 120_769, 1), 4 * 120_769) == []


def test_make_cloze_warns_of_an_evaluation_split_too_small_to_measure() -> None:
    from iaa.jobs.own_data.make_cloze import small_splits

    [valid] = small_splits({"train": 900, "valid": 44, "test": 0})
    assert valid.startswith("the valid split has only 44 questions: an accuracy measured on it has a standard "
                            "error of up to 7.5 points")
    assert small_splits({"train": 900, "valid": 400, "test": 1000}) == []
    [empty] = small_splits({"train": 900})
    assert empty.startswith("the valid split is empty")


@pytest.mark.parametrize("key, value, message", [
    ("name", "\x1b[2J\x1b[31mowned", "sweep.name: expected a name"),
    ("name", "../../elsewhere", "sweep.name: expected a name"),
    ("best_valid_acc", float("nan"), "sweep.best_valid_acc: expected an accuracy: a finite number in [0, 1], got nan"),
    ("best_valid_acc", 7.5, "sweep.best_valid_acc: expected an accuracy"),
    ("trial_max_epochs", "many", "sweep.trial_max_epochs: expected a finite number, got 'many'"),
])
def test_an_edited_best_config_is_one_line_naming_the_file_and_key_and_never_reaches_the_terminal_raw(
        tiny: Path, tmp_path: Path, key: str, value: object, message: str) -> None:
    path = tmp_path / "best_config.yaml"
    tune.write_best_config(_best_record(tiny, trial_epochs=0.5), path, "s1", train_epochs=1.0, data=tiny)
    raw = yaml.safe_load(path.read_text())
    raw["sweep"][key] = value
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    result = CliRunner().invoke(cli.cli, ["train", "--config", str(path), "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(path) in errors[0] and message in errors[0], result.output
    assert "\x1b" not in result.output and not (tmp_path / "w" / "runs").exists()
