"""CLI flags that read as they work: one meaning per name, stdout as an output, small inputs whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa import cli
from iaa.data.prepared.manifest import vocab_card
from iaa.jobs.modeling import checkpoint
from tests._explain import tiny_checkpoint
from tests._tiny import make_tiny_prepared


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(prepared folder, checkpoint, a 3-question JSON Lines file)."""
    root = tmp_path_factory.mktemp("flags")
    prepared = make_tiny_prepared(root)
    ckpt = tiny_checkpoint(prepared, root / "iaa.pt", "iaa", steps=2)
    checkpoint.save(ckpt, {**checkpoint.load(ckpt), "vocab": vocab_card(prepared)})   # as training saves it
    questions = root / "q.jsonl"
    records = [{"id": f"q{i}", "document": "the cat sat on the mat . the dog ran", "query": "the XXXXX sat",
                "candidates": ["cat", "dog", "mat"], "answer": "cat"} for i in range(3)]
    questions.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return prepared, ckpt, questions


@pytest.mark.parametrize("command, alias, dest", [
    ("train", "--data-parallel-workers", "workers"),
    ("ensemble", "--workers-per-member", "workers_per_trial"),
    ("distill", "--teacher-workers", "workers"),
])
def test_each_workers_flag_has_a_name_that_says_what_it_counts_and_keeps_the_old_one(command: str, alias: str,
                                                                                     dest: str) -> None:
    [param] = [p for p in cli.cli.commands[command].params if p.name == dest]
    assert param.opts == [alias, "--workers"]
    ctx = cli.cli.commands[command].make_context(command, [alias, "3", *(["--ensemble", "."] if command == "distill"
                                                                         else [])])
    assert ctx.params[dest] == 3


def test_report_baseline_help_shows_no_empty_range() -> None:
    result = CliRunner().invoke(cli.cli, ["report", "--help"])
    assert result.exit_code == 0 and "None" not in result.output


def test_report_baseline_still_refuses_nan() -> None:
    result = CliRunner().invoke(cli.cli, ["report", "--experiment", "x", "--baseline", "nan", "--out", "x.png"])
    assert result.exit_code == 2 and "'nan' is not a finite number" in result.output


def test_predict_out_dash_writes_the_predictions_to_stdout_and_the_summary_to_stderr(model, tmp_path: Path) -> None:
    prepared, ckpt, questions = model
    result = CliRunner().invoke(cli.cli, ["predict", "--checkpoint", str(ckpt), "--input", str(questions),
                                          "--out", "-"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["q0", "q1", "q2"]
    assert "examples: 3" in result.stderr and not Path("-").exists()


def test_explain_input_alone_explains_every_question_of_a_small_file(model, tmp_path: Path) -> None:
    prepared, ckpt, questions = model
    out = tmp_path / "page.html"
    result = CliRunner().invoke(cli.cli, ["explain", "--checkpoint", str(ckpt), "--input", str(questions),
                                          "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert [e["example_id"] for e in json.loads(result.stdout.splitlines()[-1])["examples"]] == ["q0", "q1", "q2"]


def test_explain_input_alone_refuses_a_large_file_in_one_line(model, tmp_path: Path) -> None:
    from iaa.jobs.evaluation.explaining.explain import WHOLE_INPUT

    prepared, ckpt, questions = model
    big = tmp_path / "big.jsonl"
    line = questions.read_text().splitlines()[0]
    big.write_text("".join(line.replace('"q0"', f'"b{i}"') + "\n" for i in range(WHOLE_INPUT + 1)))
    result = CliRunner().invoke(cli.cli, ["explain", "--checkpoint", str(ckpt), "--input", str(big),
                                          "--out", str(tmp_path / "p.html")])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert f"holds {WHOLE_INPUT + 1} questions" in result.output and "--first N" in result.output


@pytest.mark.timeout(300)
def test_bench_takes_a_workdir_and_saves_its_result_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = ["--set", "model.embed_dim=16", "--set", "model.hidden_dim=8", "--set", "model.state_dim=8",
             "--set", "model.gate_dim=8", "--set", "model.steps=1", "--set", "bench.steps=1",
             "--set", "bench.warmup=0", "--set", "bench.batch_size=2", "--set", "bench.precision=fp32"]
    result = CliRunner().invoke(cli.cli, ["bench", *small, "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.splitlines()[-1])
    saved = tmp_path / "w" / "bench" / "iaa-cpu.json"
    assert out["saved"] == str(saved) and json.loads(saved.read_text()) == {k: v for k, v in out.items() if k != "saved"}
    monkeypatch.chdir(tmp_path)
    again = CliRunner().invoke(cli.cli, ["bench", *small, "--workdir", "w", "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout.splitlines()[-1])["saved"] == str(saved.resolve())


def test_tune_sampler_grid_over_a_range_is_one_message_naming_the_parameter(model, tmp_path: Path) -> None:
    from _faults import assert_one_message, invoke

    prepared, _, _ = model
    space = tmp_path / "space.yaml"
    space.write_text("model.steps: [1, 2]\ntrain.lr: {low: 0.001, high: 0.01, log: true}\n", encoding="utf-8")
    code, output = invoke("tune", "--data", prepared, "--sampler", "grid", "--search-space", space,
                          "--workdir", tmp_path / "work", "--num-samples", "2")
    assert_one_message(code, output, "grid sampler", "train.lr is a range")
    assert not (tmp_path / "work" / "sweeps").exists()                   # refused before anything is written


def test_tune_sampler_takes_only_the_names_it_maps() -> None:
    from iaa.jobs.config.presets import SAMPLERS

    [param] = [p for p in cli.cli.commands["tune"].params if p.name == "sampler"]
    assert tuple(param.type.choices) == SAMPLERS and param.default is None          # None: tpe, or the record's
    result = CliRunner().invoke(cli.cli, ["tune", "--dataset", "demo", "--sampler", "bayes"])
    assert result.exit_code == 2 and "'bayes' is not one of" in result.output


def test_the_json_object_lists_the_warnings_the_command_logged(model, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import FakeLauncher, FakeTracker, tune_on
    from tests._platform import write_space
    from tests._tiny import TINY_SETS

    prepared, _, _ = model
    space = write_space(tmp_path)
    tune_on(monkeypatch, FakeTracker(), FakeLauncher())
    sets = [arg for s in TINY_SETS for arg in ("--set", s)]          # model.steps=2, which the space searches
    result = CliRunner().invoke(cli.cli, ["tune", "--data", str(prepared), "--num-samples", "1", "--search-space",
                                          str(space), *sets, "--workdir", str(tmp_path / "work"), "--json"])

    assert result.exit_code == 0, result.output
    [logged] = [line for line in result.stderr.splitlines() if "model.steps=2 has no effect" in line]
    warnings = json.loads(result.stdout.splitlines()[-1])["warnings"]
    assert [w for w in warnings if "model.steps=2 has no effect" in w] == [logged.removeprefix("warning: ")]
    summary = json.loads(result.stdout.splitlines()[-1])           # the summary names the best trial's page and figure
    assert f"explain page: {summary['explain_page']}" in result.stderr and Path(summary["explain_png"]).is_file()
    assert f"its figure:   {summary['explain_png']}" in result.stderr


def test_with_json_a_failure_is_a_json_object_on_stdout_beside_its_error_line(tmp_path: Path) -> None:
    from _faults import assert_says

    result = CliRunner().invoke(cli.cli, ["baseline", "--dataset", "cbt-ne", "--workdir", str(tmp_path), "--json"])
    assert result.exit_code == 1
    failure = json.loads(result.stdout.splitlines()[-1])
    assert failure["exit_code"] == 1 and result.stderr.strip() == f"Error: {failure['error']}"
    assert_says(failure["error"], "cbt-ne")
    plain = CliRunner().invoke(cli.cli, ["baseline", "--dataset", "cbt-ne", "--workdir", str(tmp_path)])
    assert plain.exit_code == 1 and plain.stdout == ""                   # without --json, stdout stays empty


def test_with_json_a_stop_is_a_json_object_naming_its_signal(model, monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa.jobs import interrupt
    from iaa.jobs.evaluation import frequency

    def stopped(*args: object) -> None:
        raise interrupt.Interrupted("SIGTERM", "interrupted by SIGTERM: nothing is kept")

    monkeypatch.setattr(frequency, "run", stopped)
    prepared, _, _ = model
    result = CliRunner().invoke(cli.cli, ["baseline", "--data", str(prepared), "--json"])
    assert result.exit_code == 143
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "error": "interrupted by SIGTERM: nothing is kept", "interrupted": "SIGTERM", "exit_code": 143}


def test_with_log_format_json_the_summary_and_an_error_are_json_objects(model, tmp_path: Path) -> None:
    from _faults import assert_says

    prepared, ckpt, _ = model
    ok = CliRunner().invoke(cli.cli, ["--quiet", "--log-format", "json", "evaluate", "--checkpoint", str(ckpt),
                                      "--data", str(prepared), "--split", "valid", "--out", str(tmp_path / "p.parquet"),
                                      "--json"])
    assert ok.exit_code == 0, ok.output
    lines = [json.loads(line) for line in ok.stderr.splitlines()]          # every line is an object
    [summary] = [line for line in lines if line.get("event") == "summary"]  # --quiet keeps the summary
    assert summary["level"] == "info" and "accuracy" in summary["message"]
    failed = CliRunner().invoke(cli.cli, ["--log-format", "json", "baseline", "--dataset", "cbt-ne",
                                          "--workdir", str(tmp_path)])
    assert failed.exit_code == 1 and failed.stdout == ""
    [error] = [json.loads(line) for line in failed.stderr.splitlines()]
    assert (error["level"], error["event"]) == ("error", "failed")
    assert_says(error["message"], "cbt-ne")


def _json_of(*args: str) -> dict:
    """The JSON object of one command that must succeed."""
    result = CliRunner().invoke(cli.cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[-1])


def test_json_paths_are_absolute_whatever_was_typed(model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tests._tiny import TINY_SETS

    prepared, ckpt, questions = model
    monkeypatch.chdir(tmp_path)
    checkpoint, data = (os.path.relpath(p, tmp_path) for p in (ckpt, prepared))
    sets = [a for s in (*TINY_SETS, "train.max_epochs=0.5") for a in ("--set", s)]
    fields = _json_of("evaluate", "--checkpoint", checkpoint, "--data", data, "--split", "valid", "--out", "p.parquet",
                      "--workdir", "w")
    fields.update(_json_of("explain", "--checkpoint", checkpoint, "--data", data, "--first", "1", "--out", "e.html",
                           "--png", "e.png", "--workdir", "w"))
    fields["answers"] = _json_of("predict", "--checkpoint", checkpoint, "--input", os.path.relpath(questions, tmp_path),
                                 "--out", "a.jsonl")["predictions"]
    fields["out"] = _json_of("prepare", "--dataset", "demo", "--out", "d", "--workdir", "w")["out"]
    fields["trained_on"] = _json_of("train", "--data", data, *sets, "--workdir", "w")["data_dir"]
    fields["figure"] = _json_of("report", "--experiment", "train-cbt-ne", "--out", "c.png", "--workdir", "w")["out"]
    fields["workdir"] = _json_of("report", "--sweeps", "--workdir", "w")["workdir"]
    for key in ("checkpoint", "data_dir", "predictions", "html", "png", "answers", "out", "trained_on", "figure",
                "workdir"):
        assert Path(fields[key]).is_absolute() and Path(fields[key]).exists(), key


def test_key_value_lines_write_lists_mappings_and_truth_as_json_does() -> None:
    from iaa.cli.output import value_text

    assert [value_text(v) for v in (True, None, {"train": 3}, ["a", "b"], 0.1234567, "x")] == \
        ["true", "null", '{"train": 3}', '["a", "b"]', "0.123457", "x"]


def test_a_results_warnings_follow_the_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    """A result's warnings go through the console's handler: JSON objects with --log-format json."""
    from iaa import logs
    from iaa.cli.output import show_warnings

    try:
        logs.to_console(json_lines=True)
        show_warnings({"warnings": ["q.jsonl:2: candidate(s) Zork do not occur in the document"]})
        [line] = capsys.readouterr().err.splitlines()
        assert json.loads(line)["level"] == "warning" and "Zork" in json.loads(line)["message"]
        logs.to_console()
        show_warnings({"warnings": ["plain"]})
        assert capsys.readouterr().err.splitlines() == ["warning: plain"]
    finally:
        logs.to_console()


def test_an_unknown_bench_setting_is_a_config_error_naming_the_known_ones(tmp_path: Path) -> None:
    from _faults import assert_says

    result = CliRunner().invoke(cli.cli, ["bench", "--set", "bench.foo=1", "--workdir", str(tmp_path)])
    assert result.exit_code == 1, result.output                     # as train's unknown key
    assert_says(result.output, "unknown config key 'bench.foo'", "threads")
