"""From command-line choices to a prepared data folder and a complete job config."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from iaa.jobs import config as config_mod
from iaa.jobs.config import JobConfig
from iaa.jobs.presets import for_dataset


def data_dir(dataset: str | None, data: Path | None, workdir: Path) -> tuple[str, Path]:
    """The dataset name and prepared folder: ``data`` as given, or ``dataset`` under ``workdir``.

    ``demo`` is generated and prepared on first use; other datasets must have been prepared.
    """
    if data is not None:
        manifest = Path(data) / "manifest.json"
        if not manifest.is_file():
            raise FileNotFoundError(f"{data} holds no manifest.json: prepare it first with `iaa-cli prepare`")
        name = json.loads(manifest.read_text(encoding="utf-8")).get("dataset", dataset or "demo")
        return str(name), Path(data)
    if dataset is None:
        raise ValueError("give --dataset NAME or --data PREPARED_DIR")
    from iaa.jobs.prepare import ensure_prepared

    return dataset, ensure_prepared(dataset, Path(workdir))


def vocab_size(prepared: Path) -> int:
    return len(json.loads((Path(prepared) / "vocab.json").read_text(encoding="utf-8")))


def job_config(
    dataset: str,
    prepared: Path,
    *,
    model_kind: str | None = None,
    config_file: Path | None = None,
    sets: Sequence[str] = (),
) -> JobConfig:
    """Dataset preset, then the YAML file, then ``--model``, then ``--set`` overrides."""
    cfg = config_mod.load(for_dataset(dataset), config_file)
    if model_kind is not None:
        cfg = replace(cfg, model=replace(cfg.model, kind=model_kind))
    cfg = config_mod.load(cfg, None, sets)
    return replace(cfg, dataset=dataset, model=replace(cfg.model, vocab_size=vocab_size(prepared)))
