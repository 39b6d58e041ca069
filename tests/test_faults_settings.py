"""Fault suite, settings: every numeric setting has a finite, bounded range, YAML files are strict
(no duplicate keys, limited nesting), and a run whose loss becomes NaN or infinite stops in one
line without logging a model.

Each case is one ``Error:`` line (exit 1) naming the key or file, or click's usage error (exit 2)
for a flag; none is a traceback or a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _faults import TINY_MODEL, assert_one_message, invoke, make_prepared
from iaa.jobs.config import search_space
from iaa.jobs.config.job_config import ConfigError, JobConfig, load

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("settings"))[1]


def train(prepared: Path, workdir: Path, *sets: str, config: Path | None = None) -> tuple[int, str]:
    args = ["train", "--data", prepared, "--workdir", workdir, "--json"]
    args += [x for s in (*TINY_MODEL, "train.max_epochs=2", *sets) for x in ("--set", s)]
    return invoke(*args, *(["--config", config] if config else []))


# Each of these once gave a traceback, a hang or a run on NaN; now the key is named before any work.
OUT_OF_RANGE = {
    "train.seed=1e30": "train.seed must be in [0, ",
    "train.threads=1e30": "train.threads must be in [0, ",
    "model.embed_dim=1e30": "model.embed_dim must be in [1, ",
    "model.steps=1e30": "model.steps must be in [1, ",
    "model.hidden_dim=100000": "model.hidden_dim must be in [1, ",
    "train.lr=nan": "train.lr must be in (0, 10], got nan",
    "train.lr=.inf": "train.lr must be in (0, 10], got inf",
    "train.clip=-.inf": "train.clip must be in (0, ",
    "train.embed_l2=1e30": "train.embed_l2 must be in [0, 10], got 1e+30",
    "train.lr=1e30": "train.lr must be in (0, 10], got 1e+30",
    "train.clip=1e30": "train.clip must be in (0, ",
    "train.max_epochs=.inf": "train.max_epochs must be in (0, ",
    "model.halt_bias_init=nan": "model.halt_bias_init must be in [",
    "model.ponder_cost=inf": "model.ponder_cost must be in [0, ",
    "model.dropout=nan": "model.dropout must be in [0, 1)",
    "distill.temperature=1e30": "distill.temperature must be in (0, ",
    "train.seed=1" + "0" * 400: "train.seed must be in [0, ",
    "train.lr=1" + "0" * 400: "train.lr: a number of about 400 digits is too large",
}


@pytest.mark.parametrize("setting", list(OUT_OF_RANGE))
def test_a_setting_out_of_its_range_is_one_line_naming_the_key(prepared, tmp_path, setting):
    code, output = train(prepared, tmp_path / "work", setting)
    assert_one_message(code, output, OUT_OF_RANGE[setting])
    assert not (tmp_path / "work" / "runs").exists() or not any((tmp_path / "work" / "runs").rglob("*.pt"))


def test_a_yaml_config_with_a_duplicate_key_names_the_file_and_line(prepared, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  lr: 0.001\n  batch_size: 8\n  lr: 0.1\n", encoding="utf-8")
    assert_one_message(*train(prepared, tmp_path / "work", config=config), f"{config}, line 4",
                       "duplicate key 'lr' (first on line 2)")
    merged = tmp_path / "merge.yaml"         # a merge key's values may be overridden: no duplicate
    merged.write_text("base: &b {lr: 0.5, batch_size: 8}\ntrain:\n  <<: *b\n  lr: 0.002\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown config key 'base'"):   # parsed, then its keys checked
        load(JobConfig(), merged)


@pytest.mark.parametrize("flow", [False, True])
def test_a_5000_deep_yaml_is_one_line_not_a_recursion_error(prepared, tmp_path, flow):
    config = tmp_path / "deep.yaml"
    text = "[" * 5000 + "]" * 5000 if flow else "".join(" " * i + "k:\n" for i in range(5000))
    config.write_text(text, encoding="utf-8")
    assert_one_message(*train(prepared, tmp_path / "work", config=config), str(config), "nested more than")


def test_a_deep_set_value_is_one_line(prepared, tmp_path):
    assert_one_message(*train(prepared, tmp_path / "work", "train.lr=" + "[" * 5000 + "]" * 5000),
                       "--set", "nested more than")


@pytest.mark.parametrize("spec, message", [
    ("model.hidden_dim: {low: 64, high: 1.0e30}", "model.hidden_dim must be in [1, "),
    ("model.hidden_dim: [64, 1.0e30]", "model.hidden_dim must be in [1, "),
    ("train.lr: {low: .nan, high: 1.0e-2}", "train.lr.low: expected a finite number, got nan"),
    ("train.lr: {low: 1.0e-4, high: .inf, log: true}", "train.lr.high: expected a finite number, got inf"),
    ("train.lr: [1.0e-3, .nan]", "train.lr choice: expected a finite number, got nan"),
    ("model.dropout: {low: 0.0, high: 0.5}\nmodel.dropout: [0.1]", "duplicate key 'model.dropout'"),
    ("{model.steps: [1, 2], model.steps: [3]}", "duplicate key 'model.steps' (first on line 1)"),   # one line
])
def test_a_search_space_out_of_range_or_not_finite_is_refused_before_any_trial(tmp_path, spec, message):
    path = tmp_path / "space.yaml"
    path.write_text(spec + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        search_space.load(path, JobConfig())
    assert str(path) in str(err.value) and message in str(err.value), str(err.value)


@pytest.mark.parametrize("flag", [["--alpha", "nan"], ["--temperature", "1e30"]])
def test_distill_flags_refuse_nan_inf_and_huge_values_as_usage_errors(tmp_path, flag):
    (tmp_path / "ens").mkdir()
    code, output = invoke("distill", "--ensemble", tmp_path / "ens", *flag, "--workdir", tmp_path / "w")
    assert code == 2 and f"Invalid value for '{flag[0]}'" in output and "Traceback" not in output, output


@pytest.mark.parametrize("flag", [["tune", "--dataset", "demo", "--num-samples", "10" + "0" * 30],
                                  ["ensemble", "--sweep", "s", "--seeds", "10" + "0" * 30]])
def test_count_flags_have_an_upper_bound(tmp_path, flag):
    code, output = invoke(*flag, "--workdir", tmp_path / "w")
    assert code == 2 and "is not in the range" in output, output


def test_every_numeric_field_declares_a_finite_range():
    """A new numeric field cannot be added without a range (NaN, inf and absurd sizes then pass)."""
    from dataclasses import fields

    from iaa.jobs.config.job_config import DistillConfig, TrainConfig
    from iaa.model.config import Range, ReaderConfig

    for cls in (ReaderConfig, TrainConfig, DistillConfig):
        numeric = {f.name for f in fields(cls) if f.type in ("int", "float", int, float)}
        assert numeric == set(cls.RANGES), (cls.__name__, numeric ^ set(cls.RANGES))
    assert float("nan") not in Range(0.0) and float("inf") not in Range(0.0) and -float("inf") not in Range()
    assert 0.0 not in Range(0.0, 1.0, low_open=True) and 1.0 in Range(0.0, 1.0, low_open=True)


def _numeric_settings() -> list[str]:
    """``section.field`` of every int or float field of the job config's sections."""
    from dataclasses import fields, is_dataclass

    cfg = JobConfig()
    return [f"{section.name}.{f.name}" for section in fields(cfg) if is_dataclass(getattr(cfg, section.name))
            for f in fields(getattr(cfg, section.name)) if f.type in ("int", "float", int, float)]


@pytest.mark.parametrize("value", ["1e30", "-1e30", ".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", _numeric_settings())
def test_every_numeric_setting_refuses_huge_infinite_and_nan_values_naming_the_key(key, value):
    """A new numeric field without a finite upper bound fails here (``train.embed_l2=1e30`` trained to a loss of 9e30)."""
    with pytest.raises(ConfigError) as err:
        load(JobConfig(), None, [f"{key}={value}"])
    assert str(err.value).startswith(key), str(err.value)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_loss_that_becomes_infinite_stops_the_run_in_one_line_and_logs_no_model(prepared, tmp_path, monkeypatch):
    """Every setting is bounded, so the loss is made infinite here: the loop's check is what is tested."""
    import mlflow

    from iaa.jobs.modeling.objective import Objective

    paper_loss = Objective.__call__
    monkeypatch.setattr(Objective, "__call__", lambda self, *args: paper_loss(self, *args) * float("inf"))

    from iaa.platform.tracking.queries import find_runs

    work = tmp_path / "work"
    code, output = train(prepared, work, "train.threads=1")
    assert_one_message(code, output, "training diverged: the loss became", "lower train.lr (now 0.001)")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    runs = find_runs(uri, "train-cbt-ne")
    assert [r.status for r in runs] == ["FAILED"] and "checkpoint" not in runs[0].tags
    client = mlflow.MlflowClient(uri)                    # not the process's global store: other tests use it
    assert client.search_logged_models([client.get_experiment_by_name("train-cbt-ne").experiment_id]) == []
