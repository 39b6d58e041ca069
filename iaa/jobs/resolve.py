"""From command-line choices to a prepared data folder and a complete job config."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from iaa.data.errors import DataError
from iaa.data.manifest import MANIFEST, rebuild_hint
from iaa.jobs import config as config_mod
from iaa.jobs.config import ConfigError, JobConfig
from iaa.jobs.presets import for_dataset


def data_dir(dataset: str | None, data: Path | None, workdir: Path) -> tuple[str, Path]:
    """The dataset name and prepared folder: ``data`` as given, or ``dataset`` under ``workdir``.

    ``demo`` is generated and prepared on first use; other datasets must have been prepared.
    Every job opens its data here, so every shard is verified here (see ``iaa.data.verify``).
    """
    from iaa.data import verify

    if data is not None:
        prepared = Path(data)
    elif dataset is None:
        raise ConfigError("give --dataset NAME or --data PREPARED_DIR")
    else:
        from iaa.jobs.prepare import ensure_prepared

        prepared = ensure_prepared(dataset, Path(workdir))
    manifest = verify.verify(prepared)
    if manifest.get("counts", {}).get("valid") == 0:
        raise DataError(f"the valid split is empty, so no accuracy can be measured; "
                        f"{rebuild_hint(prepared, manifest)} from a source with validation examples",
                        path=prepared / MANIFEST)
    return str(manifest.get("dataset", dataset)), prepared


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
