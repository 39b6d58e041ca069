"""``iaa-cli ensemble``: gather members, evaluate them, average them, and track the result.

Members come from one of two places:

- ``--members CKPT ...``: checkpoints used as they are. The data is ``--data``/``--dataset``,
  else the dataset named in the checkpoints' configs (prepared under the workdir).
- ``--sweep NAME``: ``WORKDIR/sweeps/NAME/sweep.json``. Its K best configurations (by the
  trials' ``best_valid_acc``; configurations that differ only in ``train.seed`` count as one)
  each get N seeds: the trial's own ``train.seed + i`` for ``i = 0 .. N-1``, so seed ``i = 0``
  is the trial itself. A member whose config equals, field for field (seed included), a trial
  with a checkpoint on disk, or a member trained by an earlier ensemble in the same workdir
  (each records those it trained in its ``trained.json``), reuses that checkpoint; the rest train in parallel as Ray trials
  through :func:`iaa.platform.tune.train_many`.

Every member is evaluated on valid and test with the evaluate job; :mod:`iaa.jobs.ensemble`
does the alignment, averaging and selection. Everything lands in ``WORKDIR/ensembles/NAME/``,
and one MLflow run records it (tagged ``sweep_parent_run_id`` with the sweep's parent run).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from iaa.jobs import ensemble as ensemble_job
from iaa.jobs.config import JobConfig, from_dict, to_dict
from iaa.platform import tracking

FAILED_STATUSES = {"ERROR", "FAILED"}


@dataclass(frozen=True)
class EnsembleRequest:
    """What ``iaa-cli ensemble`` asks for; exactly one of ``sweep`` and ``members``."""

    sweep: str | None = None
    members: tuple[Path, ...] = ()
    dataset: str | None = None
    data: Path | None = None
    top_configs: int = 1          # K best configurations of the sweep
    seeds: int = 5                # N seeds of each
    select: str = "all"           # all | top-p | greedy, decided on valid
    p: float = 0.5                # fraction kept by top-p
    name: str | None = None
    workdir: Path = Path("iaa-work")
    tracking_uri: str | None = None
    address: str | None = None
    storage_path: str | None = None
    show_progress: bool = True


@dataclass(frozen=True)
class Member:
    checkpoint: Path
    config: JobConfig
    mlflow_run_id: str | None
    label: str                    # short name for the table
    source: str                   # given | trial <id> | trained | trained earlier


def _config_key(cfg: JobConfig | dict[str, Any], *, ignore_seed: bool = False) -> str:
    """A canonical text of ``cfg``; dicts go through ``from_dict`` so that 4 and 4.0 compare equal."""
    data = to_dict(cfg if isinstance(cfg, JobConfig) else from_dict(cfg))
    if ignore_seed:
        data["train"].pop("seed", None)
    return json.dumps(data, sort_keys=True)


def _existing(path: str | None, bases: Sequence[Path]) -> Path | None:
    """``path`` if it is a file, else the first ``base / path`` that is."""
    if not path:
        return None
    candidates = [Path(path)] + [base / path for base in bases if not Path(path).is_absolute()]
    return next((c for c in candidates if c.is_file()), None)


def _run_dir_label(checkpoint: Path) -> str:
    return checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.stem


# --- members from checkpoints ------------------------------------------------------------------


def _find_run_id(uri: str, checkpoint: Path) -> str | None:
    """The MLflow run whose ``checkpoint`` tag names ``checkpoint`` (as given or absolute), if any."""
    spellings = {str(checkpoint), str(checkpoint.resolve())}
    if any("'" in s for s in spellings):
        return None
    try:
        client = tracking.open_client(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        for spelling in spellings:
            runs = client.search_runs(experiments, filter_string=f"tags.checkpoint = '{spelling}'",
                                      max_results=1, order_by=["attributes.start_time DESC"])
            if runs:
                return runs[0].info.run_id
    except Exception:  # noqa: BLE001 - a link to the training run is a courtesy, never a failure
        return None
    return None


def given_members(paths: Sequence[Path], uri: str) -> list[Member]:
    from iaa.jobs import checkpoint

    members = []
    for path in paths:
        cfg = from_dict(checkpoint.load(Path(path))["config"])
        members.append(Member(Path(path), cfg, _find_run_id(uri, Path(path)),
                              f"{_run_dir_label(Path(path))}", "given"))
    return members


# --- members from a sweep ----------------------------------------------------------------------


def read_sweep(workdir: Path, name: str) -> dict[str, Any]:
    path = Path(workdir) / "sweeps" / name / "sweep.json"
    if not path.is_file():
        raise FileNotFoundError(f"no sweep {name!r}: {path} does not exist (run `iaa-cli tune --name {name}` first)")
    sweep = json.loads(path.read_text(encoding="utf-8"))
    if not sweep.get("trials"):
        raise ValueError(f"sweep {name!r} has no trials in {path}")
    return sweep


def best_configs(sweep: dict[str, Any], k: int) -> list[JobConfig]:
    """The ``k`` best distinct configurations (seed ignored) by the trials' best valid accuracy."""
    ranked = sorted(
        (t for t in sweep["trials"] if t.get("best_valid_acc") is not None and t.get("status") not in FAILED_STATUSES),
        key=lambda t: -float(t["best_valid_acc"]),
    )
    chosen: dict[str, JobConfig] = {}
    for trial in ranked:
        key = _config_key(trial["config"], ignore_seed=True)
        if key not in chosen:
            chosen[key] = from_dict(trial["config"])
        if len(chosen) == k:
            break
    if not chosen:
        raise ValueError(f"sweep {sweep.get('name')!r} has no finished trial with a validation accuracy")
    if len(chosen) < k:
        print(f"ensemble: sweep {sweep.get('name')!r} has only {len(chosen)} distinct configurations; "
              f"using {len(chosen)} instead of {k}", file=sys.stderr)
    return list(chosen.values())


def _ledger(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / "trained.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def _all_ledgers(workdir: Path) -> list[dict[str, Any]]:
    """The members trained by every ensemble under ``workdir`` (each records its own in trained.json)."""
    return [entry for path in sorted((Path(workdir) / "ensembles").glob("*/trained.json"))
            for entry in _ledger(path.parent)]


def sweep_members(req: EnsembleRequest, sweep: dict[str, Any], prepared: Path, out_dir: Path, uri: str,
                  name: str) -> list[Member]:
    """K best configurations x N seeds, reusing matching checkpoints and training the rest on Ray."""
    sweep_dir = Path(req.workdir) / "sweeps" / sweep["name"]
    reusable: dict[str, tuple[Path, str | None, str]] = {}
    for entry in _all_ledgers(Path(req.workdir)):
        found = _existing(entry.get("checkpoint"), [Path(req.workdir)])
        if found is not None:
            reusable[_config_key(entry["config"])] = (found, entry.get("mlflow_run_id"), "trained earlier")
    for trial in sweep["trials"]:  # trials win over the ledger: they are the sweep's own runs
        found = _existing(trial.get("checkpoint"), [sweep_dir, Path(req.workdir)])
        if found is not None and trial.get("status") not in FAILED_STATUSES:
            reusable[_config_key(trial["config"])] = (found, trial.get("mlflow_run_id"), f"trial {trial.get('trial_id')}")

    wanted: list[tuple[JobConfig, str]] = []
    for c, cfg in enumerate(best_configs(sweep, req.top_configs)):
        for i in range(req.seeds):
            seed = cfg.train.seed + i
            wanted.append((replace(cfg, train=replace(cfg.train, seed=seed)), f"config{c}-seed{seed}"))
    to_train = [cfg for cfg, _ in wanted if _config_key(cfg) not in reusable]
    if to_train:
        from iaa.platform import tune

        print(f"ensemble: reusing {len(wanted) - len(to_train)} checkpoints, training {len(to_train)} members on Ray",
              file=sys.stderr)
        # One Ray run name per set of members, so that a later call never lands in an earlier run's folder.
        digest = hashlib.sha1("\n".join(_config_key(c) for c in to_train).encode()).hexdigest()[:8]
        trained = tune.train_many(
            to_train, prepared, name=f"ensemble-{name}-{digest}", workdir=Path(req.workdir), tracking_uri=uri,
            parent_run_id=sweep.get("parent_run_id"), experiment=sweep.get("experiment") or f"ensemble-{sweep['dataset']}",
            address=req.address, storage_path=req.storage_path, workers_per_trial=1, show_progress=req.show_progress,
        )
        ledger, failed = _ledger(out_dir), []
        for cfg, res in zip(to_train, trained):
            found = _existing(res.get("checkpoint"), [Path(req.workdir)])
            if found is None:
                failed.append(f"seed {cfg.train.seed} (trial {res.get('trial_id')}, status {res.get('status')})")
                continue
            reusable[_config_key(cfg)] = (found, res.get("mlflow_run_id"), "trained")
            ledger.append({"config": to_dict(cfg), "checkpoint": str(found),
                           "best_valid_acc": res.get("best_valid_acc"), "mlflow_run_id": res.get("mlflow_run_id")})
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "trained.json").write_text(json.dumps(ledger, indent=1), encoding="utf-8")
        if failed:  # the members that did train are in trained.json: running again retrains only these
            raise RuntimeError(f"ensemble {name}: {len(failed)} member(s) gave no checkpoint: {'; '.join(failed)}. "
                               f"Run the same command again to retry them; the others are kept for reuse.")
    members = []
    for cfg, label in wanted:
        found, run_id, source = reusable[_config_key(cfg)]
        members.append(Member(found, cfg, run_id, label, source))
    return members


# --- evaluation and tracking -------------------------------------------------------------------


def _has_split(prepared: Path, split: str) -> bool:
    from iaa.data.loader import PreparedData

    data = PreparedData.open(Path(prepared))
    return split in data.splits and data.table(split).num_rows > 0


def evaluate_members(members: Sequence[Member], prepared: Path, out_dir: Path, show_progress: bool) -> list[dict[str, Path | None]]:
    """Each member's predictions files on valid and (where the data has it) test."""
    from tqdm import tqdm

    from iaa.jobs import evaluate

    splits = ["valid"] + (["test"] if _has_split(prepared, "test") else [])
    files: list[dict[str, Path | None]] = []
    bar = tqdm(total=len(members) * len(splits), desc="evaluate members", unit="eval", disable=not show_progress,
               file=sys.stderr)
    for i, member in enumerate(members):
        entry: dict[str, Path | None] = {"valid": None, "test": None}
        for split in splits:
            out = out_dir / "members" / f"{i:02d}-{split}.parquet"
            entry[split] = Path(evaluate.run(member.checkpoint, prepared, split, out)["predictions"])
            bar.update(1)
        files.append(entry)
    bar.close()
    return files


def _track(uri: str, experiment: str, name: str, req: EnsembleRequest, sweep: dict[str, Any] | None,
           dataset: str, members: Sequence[Member], result: dict[str, Any], out_dir: Path) -> str:
    tags: dict[str, Any] = {"kind": "ensemble", "dataset": dataset, "select": req.select,
                            "ensemble_dir": str(out_dir)}
    if sweep is not None:
        tags.update({"sweep": sweep.get("name", ""), "sweep_parent_run_id": sweep.get("parent_run_id") or ""})
    chosen = set(result["selected"])
    for i, member in enumerate(members):
        tags.update({f"member.{i}.run_id": member.mlflow_run_id or "", f"member.{i}.checkpoint": str(member.checkpoint),
                     f"member.{i}.selected": str(i in chosen).lower(), f"member.{i}.source": member.source})
    with tracking.run_context(uri, experiment, f"ensemble-{name}", tags=tags) as run:
        run.log_params({"select": req.select, "p": req.p, "top_configs": req.top_configs, "seeds": req.seeds,
                        "sweep": req.sweep or "", "n_members": len(members), "n_selected": len(chosen)})
        run.log_metrics({k: result[k] for k in ("valid_acc", "test_acc", "mean_member_valid_acc",
                                                 "mean_member_test_acc", "mean_selected_valid_acc",
                                                 "mean_selected_test_acc") if result[k] is not None})
        run.log_metrics({"boo_n": result["boo_n"], f"boo_{result['boo_n']}_valid": result["boo_valid"],
                         "boo_n_valid": result["boo_valid"],
                         **({f"boo_{result['boo_n']}_test": result["boo_test"], "boo_n_test": result["boo_test"]}
                            if result["boo_test"] is not None else {})})
        for i, acc in enumerate(result["member_valid_acc"]):
            run.log_metrics({"member_valid_acc": acc, **({"member_test_acc": result["member_test_acc"][i]}
                                                         if result["member_test_acc"] is not None else {})}, step=i)
        for artifact in ("predictions", "table_path"):
            run.log_artifact(Path(result[artifact]))
        run.log_artifact(out_dir / "ensemble.json")
    return run.run_id


def run(req: EnsembleRequest) -> dict[str, Any]:
    """Build, evaluate and score the ensemble that ``req`` describes; see the module docstring.

    Returns:
        ``valid_acc``, ``test_acc`` (None without a test split), ``members`` (checkpoint paths
        of the selected members, in the order of ``member_probs``), ``predictions`` (the Parquet
        path), ``all_members``, per-member and mean accuracies, ``boo_n``, ``boo_valid``,
        ``boo_test``, ``select``, ``mlflow_run_id`` and the output folder.
    """
    from iaa.jobs import resolve

    if (req.sweep is None) == (not req.members):
        raise ValueError("give exactly one of a sweep name or member checkpoints")
    if req.select not in ensemble_job.SELECT_MODES:
        raise ValueError(f"unknown selection {req.select!r}; choose from {list(ensemble_job.SELECT_MODES)}")
    if req.top_configs < 1 or req.seeds < 1:
        raise ValueError("--top-configs and --seeds must be >= 1")
    workdir = Path(req.workdir)
    uri = tracking.resolve_uri(req.tracking_uri, workdir)

    sweep: dict[str, Any] | None = None
    if req.sweep is not None:
        sweep = read_sweep(workdir, req.sweep)
        if req.dataset is None and req.data is None and sweep.get("data_dir"):
            dataset, prepared = resolve.data_dir(None, Path(sweep["data_dir"]), workdir)
        else:
            dataset, prepared = resolve.data_dir(req.dataset or sweep["dataset"], req.data, workdir)
        name = req.name or sweep["name"]
        out_dir = workdir / "ensembles" / name
        members = sweep_members(req, sweep, prepared, out_dir, uri, name)
        experiment = sweep.get("experiment") or f"ensemble-{dataset}"
    else:
        members = given_members(req.members, uri)
        named = sorted({m.config.dataset for m in members})
        if req.dataset is None and req.data is None and len(named) > 1:
            raise ValueError(f"the members were trained on different datasets {named}; pass --data or --dataset")
        dataset, prepared = resolve.data_dir(req.dataset or named[0], req.data, workdir)
        digest = hashlib.sha1("\n".join(str(Path(p).resolve()) for p in req.members).encode()).hexdigest()[:8]
        name = req.name or f"{dataset}-{len(members)}members-{req.select}-{digest}"
        out_dir = workdir / "ensembles" / name
        experiment = f"ensemble-{dataset}"

    files = evaluate_members(members, prepared, out_dir, req.show_progress)
    labels = [f"{m.label} ({m.source})" if m.source != "given" else m.label for m in members]
    result = ensemble_job.run(files, [str(m.checkpoint) for m in members], out_dir, select_mode=req.select,
                              p=req.p, labels=labels)
    table = result.pop("table")
    summary = {**result, "name": name, "dataset": dataset, "data_dir": str(prepared), "ensemble_dir": str(out_dir),
               "member_labels": labels, "member_run_ids": [m.mlflow_run_id for m in members],
               "sweep": req.sweep, "tracking_uri": uri}
    (out_dir / "ensemble.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    summary["mlflow_run_id"] = _track(uri, experiment, name, req, sweep, dataset, members, result, out_dir)
    (out_dir / "ensemble.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    print(table, file=sys.stderr)
    return summary
