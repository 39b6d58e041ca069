"""Job config: YAML + --set overrides, unknown keys rejected, round trip through a dict."""

from __future__ import annotations

from pathlib import Path

import pytest

from iaa.jobs import config as C
from iaa.jobs.presets import for_dataset
from iaa.model.config import preset


def test_set_overrides_nested_values_with_types() -> None:
    cfg = C.load(C.JobConfig(), None, ["train.lr=5e-4", "model.steps=3", "model.candidate_softmax=true"])
    assert cfg.train.lr == pytest.approx(5e-4)
    assert cfg.model.steps == 3 and cfg.model.candidate_softmax is True


def test_unknown_key_is_rejected_with_its_name() -> None:
    with pytest.raises(C.ConfigError, match="train.lrr"):
        C.load(C.JobConfig(), None, ["train.lrr=1"])


def test_wrong_type_is_rejected() -> None:
    with pytest.raises(C.ConfigError, match="model.steps"):
        C.load(C.JobConfig(), None, ["model.steps=abc"])


def test_invalid_value_is_rejected() -> None:
    with pytest.raises(C.ConfigError, match="dropout"):
        C.load(C.JobConfig(), None, ["model.dropout=1.5"])


def test_yaml_file_then_sets_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    C.dump_yaml(C.JobConfig(model=preset("tiny"), train=C.TrainConfig(seed=7)), path)
    cfg = C.load(for_dataset("demo"), path, ["train.seed=9"])
    assert cfg.model == preset("tiny") and cfg.train.seed == 9
    assert C.from_dict(C.to_dict(cfg)) == cfg


def test_yaml_unknown_key_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  depth: 3\n")
    with pytest.raises(C.ConfigError, match="bad.yaml.*model.depth"):
        C.load(C.JobConfig(), path)


def test_presets_follow_the_paper_check_interval() -> None:
    assert for_dataset("cbt-ne").train.check_every == 2000
    assert for_dataset("cnn").train.check_every == 5000
    assert for_dataset("cbt-cn", "as-reader").model.kind == "as-reader"
