"""Job config: YAML + --set overrides, unknown keys rejected, round trip through a dict."""

from __future__ import annotations

from pathlib import Path

import pytest

from iaa.jobs.config import job_config as C
from iaa.jobs.config.presets import for_dataset
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


def test_presets_cover_every_dataset_and_train_max_epochs_takes_a_fraction() -> None:
    from iaa.data.datasets import DATASETS
    from iaa.jobs.config.presets import DATASET_PRESETS

    assert tuple(DATASET_PRESETS) == DATASETS
    for name in DATASETS:
        assert C.load(for_dataset(name), None, ["train.max_epochs=0.5"]).train.max_epochs == 0.5


def _sample(declared: type, current: object) -> object:
    """A value of the declared type that differs from ``current`` and passes range checks."""
    import typing

    if typing.get_origin(declared) is typing.Literal:
        return next(v for v in typing.get_args(declared) if v != current)
    return {bool: not current, int: int(current) + 1, float: float(current) * 0.5 + 0.25,
            str: f"{current}x"}[declared]


@pytest.mark.parametrize("dataset", ["demo", "cbt-ne", "cbt-cn", "cbt-v", "cbt-p", "cnn"])
def test_every_key_of_every_preset_takes_a_value_of_its_declared_type(dataset: str) -> None:
    base = for_dataset(dataset)
    for section in ("model", "train"):
        sub = getattr(base, section)
        for key, declared in C.field_types(sub).items():
            value = _sample(declared, getattr(sub, key))
            text = str(value).lower() if isinstance(value, bool) else str(value)
            cfg = C.load(base, None, [f"{section}.{key}={text}"])
            assert getattr(getattr(cfg, section), key) == value, (section, key)
            assert type(getattr(getattr(cfg, section), key)) is type(value)


@pytest.mark.parametrize("item, bound", [
    ("train.check_every=-5", "in [0, 1e+09]"), ("train.lr_decay=0", "in (0, 1]"), ("train.threads=-3", "in [0, 4096]"),
    ("train.max_minutes=-1", "in [0, 1e+07]"), ("train.max_epochs=nan", "in (0, 1e+06]"), ("train.lr=inf", "in (0, 10]"),
    ("train.patience=0", "in [1, 1e+06]"), ("train.clip=0", "in (0, 1e+06]"), ("model.steps=0", "in [1, 256]"),
])
def test_out_of_range_settings_are_rejected_naming_the_key(item: str, bound: str) -> None:
    key = item.split("=")[0]
    with pytest.raises(C.ConfigError) as info:
        C.load(for_dataset("cbt-ne"), None, [item])
    assert str(info.value).startswith(f"{key} must be {bound}")


def test_model_kind_must_be_one_of_the_declared_kinds() -> None:
    with pytest.raises(C.ConfigError, match="model.kind: expected one of"):
        C.load(C.JobConfig(), None, ["model.kind=transformer"])


def test_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  lr: 0.1\n  seed: [1, 2\nmodel: {}\n")
    with pytest.raises(C.ConfigError, match=r"broken.yaml, line \d+: not valid YAML"):
        C.load(C.JobConfig(), path)


def test_chosen_keys_lists_what_the_user_gave_whatever_the_value(tmp_path: Path) -> None:
    from iaa.jobs.datasets.resolve import chosen_keys

    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_epochs: 10\nmodel:\n  steps: 8\n")
    assert chosen_keys(path, ["train.lr=1e-3"]) == {"train.max_epochs", "model.steps", "train.lr"}
    assert chosen_keys(None) == set()
