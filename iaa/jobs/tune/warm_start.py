"""``tune --warm-start SWEEP``: a new sweep whose study begins with an earlier sweep's trials.

The sampler of a fresh sweep knows nothing for its first trials; one that begins with the scored
trials of an earlier sweep of the same dataset and model proposes from what they showed at once,
and never proposes their configurations again. It is how a sweep whose budget is spent searches
on, and how a search space is widened or narrowed without starting blind.

:func:`settled` settles it with the rest of the sweep, opening no store (:func:`source`): the
earlier sweep is found by name (a default-named prefix, ``demo-iaa``, means its latest run) and
refused in one line where its trials cannot inform this sweep (another dataset or model, no
Optuna study kept, a resume, the grid sampler), and the settings the two sweeps' trials do not
share are named (their accuracies are compared as they stand). A new sweep without a warm start
that would repeat a recent one of its work folder is told so (:func:`repeated`). The launcher
carries the trials (:meth:`~iaa.jobs.ports.Launcher.carry_trials`) and :func:`carried_line` says
what it carried.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from iaa.errors import IaaError
from iaa.jobs.config.job_config import IMPLEMENTATION_KEYS, ConfigError, JobConfig, apply, flat, from_dict
from iaa.jobs.config.presets import DEFAULT_SAMPLER
from iaa.jobs.config.search_space import SearchSpace
from iaa.jobs.ports import Carried, TrialRecord, WarmStart
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.workdir.fields import RecordError

RECENT = 20                   # the newest sweeps of a work folder that a new sweep is compared with
SHOWN_DIFFERENCES = 3         # settings named in the note on what the two sweeps do not share
_UNSHARED = ("dataset", "train.seed", *IMPLEMENTATION_KEYS)   # never compared: checked, seeded or speed only


def settled(name: str | None, sweep: str, resumed: bool, workdir: Path, dataset: str, base: JobConfig,
            space: SearchSpace, sampler: str, seed: int) -> tuple[WarmStart | None, list[str]]:
    """The warm start from sweep ``name`` (None: none) of the sweep ``sweep`` of ``dataset`` with
    ``base``, ``space``, ``sampler`` and ``seed``, and the notes to show; a ``resumed`` sweep keeps
    its study. A new sweep without a warm start is checked against the other sweeps it would
    repeat (:func:`repeated`)."""
    if name is None:
        return None, [] if resumed else repeated(workdir, dataset, base, space, sampler, seed, besides=sweep)
    if resumed:
        raise IaaError(f"sweep {sweep} resumes with the study it began with; `warm_start` begins a new sweep: "
                       "give it without `resume`")
    return source(name, workdir, dataset, base, space, sampler)


def source(name: str, workdir: Path, dataset: str, base: JobConfig, space: SearchSpace,
           sampler: str) -> tuple[WarmStart, list[str]]:
    """The earlier sweep ``name`` as a warm start of a sweep of ``dataset`` with ``base`` and
    ``space``, and a note for what their trials do not share; IaaError when it cannot be one."""
    if sampler == "grid":
        raise ConfigError("the grid sampler tries every configuration in its own order whatever the study holds; "
                          "a warm start needs a sampler that reads it: give `sampler` tpe, gp, random or cmaes")
    path = sweep_file.find(workdir, name)
    earlier = sweep_file.read(path)
    if earlier.optuna is None:
        raise RecordError(f"{path}: optuna: the sweep kept no Optuna study, so it has no trials to begin with; "
                          "run the sweep without `warm_start`")
    if earlier.dataset != dataset:
        raise IaaError(f"sweep {earlier.name} searched {earlier.dataset}, this sweep searches {dataset}: its "
                       f"accuracies do not carry over; warm-start from a sweep of {dataset}")
    if not earlier.base:
        raise RecordError(f"{path}: base: missing; the sweep's trials cannot be placed in this search space "
                          "without the config they ran with")
    saved = earlier.search_space or {}
    try:
        theirs = flat(apply(from_dict(dict(earlier.base)), saved.get("fixed") or {}))
    except ConfigError as err:
        raise RecordError(f"{path}: base: {err}; its trials cannot be placed in this search space") from None
    ours = flat(apply(base, space.fixed))
    if theirs["model.kind"] != ours["model.kind"]:
        raise IaaError(f"sweep {earlier.name} searched the {theirs['model.kind']} model, this sweep the "
                       f"{ours['model.kind']} model: its accuracies do not carry over; warm-start from a sweep of "
                       f"{ours['model.kind']}")
    searched = set(saved.get("params") or {})
    warm = WarmStart(sweep=earlier.name, study_storage=earlier.optuna.storage, study_name=earlier.optuna.study,
                     filled={k: theirs[k] for k in space.params if k not in searched and k in theirs},
                     fixed={k: ours[k] for k in searched if k not in space.params and k in ours})
    return warm, differences(earlier.name, theirs, ours, searched | set(space.params))


def repeated(workdir: Path, dataset: str, base: JobConfig, space: SearchSpace, sampler: str, seed: int,
             besides: str | None = None) -> list[str]:
    """A note when one of the :data:`RECENT` newest sweeps in ``workdir`` other than ``besides``
    (the new sweep's own name) searched ``space`` of ``dataset`` with the same config, sampler and
    seed: a new sweep proposes what it proposed and trains it alike, so its trials would repeat
    that sweep's; the note names the warm start that searches on instead. Records are compared as
    JSON (a damaged one is skipped: it is its own sweep's problem), the config only where the rest
    matches."""
    ours, searched = _compared(flat(base)), json.loads(space.to_json())
    for path in [p for p in sweep_file.newest(workdir) if p.parent.name != besides][:RECENT]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            same = (isinstance(data, dict) and data.get("dataset") == dataset and data.get("seed") == seed
                    and (data.get("sampler") or DEFAULT_SAMPLER) == sampler and data.get("search_space") == searched
                    and isinstance(data.get("base"), dict) and _compared(flat(from_dict(data["base"]))) == ours)
        except (IaaError, OSError, ValueError):
            continue
        if same:
            name = data.get("name") or path.parent.name
            instead = ("give another `seed`" if sampler == "grid"
                       else f"to search on from its trials give `warm_start` {name}, or another `seed`")
            return [f"sweep {name} in this work folder searched the same space of {dataset} with the same config, "
                    f"sampler and `seed`: this sweep would propose its configurations again and train them alike; "
                    f"{instead}"]
    return []


def _compared(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in IMPLEMENTATION_KEYS}


def differences(sweep: str, theirs: dict[str, Any], ours: dict[str, Any], searched: set[str]) -> list[str]:
    """A note naming the settings (neither searched nor :data:`_UNSHARED`) that sweep ``sweep``'s
    trials ran with other values of; none when they share them all."""
    keys = sorted(k for k in theirs.keys() | ours.keys()
                  if k not in searched and k not in _UNSHARED and theirs.get(k) != ours.get(k))
    if not keys:
        return []
    shown = ", ".join(f"{k} {_value(theirs.get(k))} (this sweep: {_value(ours.get(k))})"
                      for k in keys[:SHOWN_DIFFERENCES])
    more = f" and {len(keys) - SHOWN_DIFFERENCES} more" if len(keys) > SHOWN_DIFFERENCES else ""
    return [f"the trials of sweep {sweep} ran with {shown}{more}: the sampler compares their accuracies with "
            "this sweep's as they stand"]


def no_study(warm: WarmStart) -> IaaError:
    """The error of a warm start whose earlier sweep's study is gone from its storage."""
    return IaaError(f"sweep {warm.sweep}: no Optuna study {warm.study_name!r} in {warm.study_storage}, so it has "
                    "no trials to begin with; run the sweep without `warm_start`")


def carried_line(carried: Carried) -> str:
    """What a warm start carried, and what it left out and why, in one line."""
    if carried.trials:
        head = (f"warm start: {carried.trials} scored trial(s) of sweep {carried.sweep} begin this sweep's study "
                f"(best valid_acc {carried.best:.4f}); the sampler proposes from them at once and never proposes "
                "their configurations again")
    else:
        head = f"warm start: no trial of sweep {carried.sweep} could begin this sweep's study, so it starts blind"
    if not carried.left_out:
        return head
    why = "; ".join(f"{reason} ({n})" for reason, n in sorted(carried.left_out.items(), key=lambda kv: -kv[1]))
    return f"{head}; {sum(carried.left_out.values())} left out: {why}"


def ahead_line(carried: Carried, best: TrialRecord) -> str:
    """A warm-started sweep whose own best trial is behind the best trial it carried."""
    return (f"the best trial carried from sweep {carried.sweep} (valid_acc {carried.best:.4f}) stays ahead of this "
            f"sweep's own best, {best.label} ({best.best_valid_acc or 0.0:.4f}); best_config.yaml and the logged "
            f"models here are this sweep's own, the carried trial's are in sweep {carried.sweep}")


def _value(value: Any) -> str:
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
