"""From command-line choices to a prepared data folder and a complete job config."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from iaa.data.bad_input import DataError
from iaa.data.prepared.manifest import MANIFEST, VOCAB, Manifest, rebuild_hint
from iaa.jobs.config import job_config as config_mod
from iaa.jobs.config.job_config import ConfigError, JobConfig
from iaa.jobs.config.presets import for_dataset
from iaa.jobs.workdir.paths import Workdir


def data_dir(dataset: str | None, data: Path | None, workdir: Path,
             splits: Sequence[str] = ()) -> tuple[str, Path]:
    """The dataset name and prepared folder: ``data`` as given, or ``dataset`` under ``workdir``.

    ``demo`` is generated and prepared on first use; other datasets must have been prepared.
    Every job opens its data here, so every shard is verified here (see ``iaa.data.prepared.verify``).
    With both, ``dataset`` must be the one the folder's manifest names (a ConfigError otherwise).
    ``splits``: those the job reads (training: train and valid), refused at once where missing,
    before the job opens a run.
    """
    from iaa.data.prepared import verify

    if data is not None:
        prepared = Path(data)
    elif dataset is None:
        raise ConfigError("give `dataset` NAME or `data` PREPARED_DIR")
    else:
        from iaa.jobs.datasets.prepare import ensure_prepared

        prepared = ensure_prepared(dataset, Workdir(workdir).writable())
    manifest = verify.verify(prepared)
    if manifest.count("valid") == 0 and ("valid" in manifest.splits or _remade_with_valid(manifest)):
        raise DataError(f"the valid split is empty, so no accuracy can be measured; {_empty_valid_hint(prepared, manifest)}",
                        path=prepared / MANIFEST)
    have = manifest.splits
    missing = [split for split in splits if split not in have]
    if missing:
        hint = (_empty_valid_hint(prepared, manifest) if "valid" in missing
                else f"give it a source with training examples and {rebuild_hint(prepared, manifest)}")
        raise DataError(f"no {' and no '.join(missing)} split here (it has {', '.join(have) or 'none'}), and this "
                        f"command reads {' and '.join(splits)}; {hint}", path=prepared / MANIFEST)
    recorded = manifest.dataset
    if data is not None and dataset is not None and recorded and recorded != dataset:
        raise ConfigError(f"{prepared / MANIFEST}: the folder holds {recorded}, not {dataset}; "
                          f"leave out `dataset` (it comes from the manifest) or give `dataset` {recorded}")
    return str(recorded or dataset), prepared


def _remade_with_valid(manifest: Manifest) -> bool:
    """The folder was prepared from make-cloze questions (which can be remade with a valid split)."""
    from iaa.data.cloze import advice

    source = manifest.source_path
    return bool(source) and advice.cloze_record(Path(source)) is not None


def _empty_valid_hint(prepared: Path, manifest: Manifest) -> str:
    """How to get a valid split: remake make-cloze questions with one, else prepare another source."""
    from iaa.data.cloze import advice

    source = manifest.source_path
    return ((advice.empty_valid(Path(source), prepared) if source else None)
            or f"give it a source with validation examples and {rebuild_hint(prepared, manifest)}")


def vocab_size(prepared: Path) -> int:
    return len(json.loads((Path(prepared) / VOCAB).read_text(encoding="utf-8")))


def job_config(
    dataset: str,
    prepared: Path,
    *,
    model_kind: str | None = None,
    config_file: Path | None = None,
    sets: Sequence[str] = (),
    base: JobConfig | None = None,
) -> JobConfig:
    """Dataset preset (or ``base``: a resumed run's own config), then the YAML file, then
    ``--model``, then ``--set`` overrides."""
    cfg = config_mod.load(base or for_dataset(dataset), config_file)
    if model_kind is not None:
        cfg = replace(cfg, model=replace(cfg.model, kind=model_kind))
    cfg = config_mod.load(cfg, None, sets)
    return replace(cfg, dataset=dataset, model=replace(cfg.model, vocab_size=vocab_size(prepared)))


def run_dir(dataset: str, cfg: JobConfig, given: Path | None, workdir: Path, sweep: str | None = None) -> Path:
    """The run folder of ``train``: ``given``, else ``WORKDIR/runs/DATASET-MODEL-seedN``, or for a
    sweep's best configuration (``best_config.yaml``) ``WORKDIR/runs/SWEEP-best-seedN``, apart from
    a plain run of the same dataset."""
    if given is not None:
        return Path(given)
    stem = f"{sweep}-best" if sweep else f"{dataset}-{cfg.model.kind}"
    return Workdir(workdir).run(f"{stem}-seed{cfg.train.seed}").path


def chosen_keys(config_file: Path | None, sets: Sequence[str] = ()) -> set[str]:
    """Dotted keys (``train.max_epochs``) that the YAML file or ``--set`` give, whatever their values."""
    given = [config_mod.read_yaml(Path(config_file))] if config_file is not None else []
    return {key for tree in [*given, config_mod.parse_sets(sets)] if isinstance(tree, Mapping)
            for key in config_mod.flatten(tree)}
