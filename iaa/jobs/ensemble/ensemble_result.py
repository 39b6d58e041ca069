"""What ``iaa-cli ensemble`` hands back (:class:`EnsembleResult`: the fields of its
``ensemble.json``, with its logged model) and says at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from iaa.jobs.evaluation import calibration, frequency
from iaa.jobs.evaluation.closing import Command, next_block, where
from iaa.jobs.evaluation.model_card import accuracy_words
from iaa.jobs.evaluation.result import Result, absent_when_none
from iaa.jobs.workdir.paths import Workdir


@dataclass(frozen=True, kw_only=True)
class EnsembleResult(Result):
    """An ensemble: its accuracies (test: None without a test split; ``*_n`` and ``*_stderr``
    beside each), its members (``members``: the selected ones' checkpoints, in the order of the
    predictions; ``all_members``: every one), each member's accuracy and their means, Boo(n), the
    files it wrote and the MLflow run and model that record it. With a sweep's ``--top-configs K``
    of 2 or more, ``configurations`` holds each configuration's seeds and their mean, and
    ``configuration_lead`` the leader's gap over the runner-up, its standard error and whether the
    seeds rank them (None with one seed each): :mod:`iaa.jobs.ensemble.configurations`.
    ``baseline_valid_acc`` and ``baseline_test_acc`` (no key without a test split) are the
    most-frequent-candidate accuracies its own are shown beside; ``warnings`` says when it is not
    above the one on valid."""

    valid_acc: float
    test_acc: float | None
    member_valid_acc: tuple[float, ...]
    member_test_acc: tuple[float, ...] | None
    mean_member_valid_acc: float | None
    mean_member_test_acc: float | None
    mean_selected_valid_acc: float | None
    mean_selected_test_acc: float | None
    boo_n: int                                  # the members selected: Boo(n) is over as many
    boo_valid: float | None
    boo_test: float | None
    members: tuple[str, ...]
    selected: tuple[int, ...]                   # the selected members' indices in ``all_members``
    select: str                                 # all | top-p | greedy
    p: float | None                             # top-p's fraction
    all_members: tuple[str, ...]
    selection_trace: tuple[dict[str, Any], ...]  # greedy's: each member added, with the valid accuracy
    examples: dict[str, int]                    # questions per split
    predictions: str                            # the averaged predictions (Parquet)
    table_path: str                             # the results table (text)
    name: str
    dataset: str
    data_dir: str
    ensemble_dir: str
    member_labels: tuple[str, ...]
    member_run_ids: tuple[str | None, ...]
    sweep: str | None
    tracking_uri: str
    mlflow_run_id: str
    member_sha256: dict[str, str]               # checkpoint -> its digest when first read
    valid_acc_n: int
    valid_acc_stderr: float | None
    test_acc_n: int
    test_acc_stderr: float | None
    model_uri: str | None = None
    baseline_valid_acc: float | None = None     # the most-frequent-candidate accuracy on valid
    baseline_test_acc: float | None = absent_when_none()    # and on test, where the data has it
    calibration: dict[str, float] | None = absent_when_none()   # iaa.jobs.evaluation.ensembling.averaging.calibrations
    temperature: float = 1.0                    # the ensemble's distributions are scaled by it (fitted on valid)
    calibrate: bool = True                      # whether it was fitted (False: --no-calibrate)
    configurations: tuple[dict[str, Any], ...] | None = absent_when_none()
    configuration_lead: dict[str, Any] | None = absent_when_none()


def of_record(record: Mapping[str, Any], req: Any) -> EnsembleResult:
    """The result of the ensemble's ``record`` (what ``ensemble.json`` holds), with its next
    commands (``req``'s ``workdir`` names where they run; the record's store, where it is not the
    work folder's own, the store they record in)."""
    at = where(req.workdir, Workdir(req.workdir).named_store(record.get("tracking_uri")))
    folder, data = record["ensemble_dir"], record["data_dir"]
    tuples = {key: tuple(record[key]) for key in ("member_valid_acc", "members", "selected", "all_members",
                                                   "selection_trace", "member_labels", "member_run_ids",
                                                   "configurations") if record.get(key) is not None}
    test, baseline = record.get("member_test_acc"), record.get("baseline_valid_acc")
    below = ([] if baseline is None
             else frequency.below_warning(record["valid_acc"], baseline, f"the ensemble {record['name']}"))
    return EnsembleResult(**{**record, **tuples, "member_test_acc": None if test is None else tuple(test)},
                          warnings=tuple(below),
                          next=(Command.of("serve", ensemble_dir=folder, data=data, **at),
                                Command.of("evaluate", checkpoint=record["members"][0], data=data, split="valid",
                                           **at),
                                Command.of("distill", ensemble_dir=folder, **at)))


def calibration_line(found: Mapping[str, float] | None) -> str:
    """The ensemble's log-loss and calibration error on valid beside its members' on average; ""
    for a record written before they were kept."""
    keys = ("valid_log_loss", "mean_member_valid_log_loss", "valid_calibration_error",
            "mean_member_valid_calibration_error")
    if not found or any(found.get(key) is None for key in keys):
        return ""
    loss, member_loss, error, member_error = (found[key] for key in keys)
    return (f"  calibration:  valid log-loss {loss:.3f} (members {member_loss:.3f} on average), calibration error "
            f"{100 * error:.1f} points (members {100 * member_error:.1f})\n")


def temperature_line(temperature: float, found: Mapping[str, float] | None, all_right: bool = False) -> str:
    """What the temperature fitted on valid did: to the test split's figures where there is one
    (questions it was not fitted to), else to valid's; at 1.0, why where valid was answered
    ``all_right`` (it cannot say how sure to be), else ""."""
    if temperature == 1.0 and all_right:
        return ("  temperature:  not fitted: every valid answer is right, so valid cannot say how sure the "
                "ensemble should be\n")
    if temperature == 1.0 or not found:
        return ""
    split = "test" if "calibrated_test_log_loss" in found else "valid"
    keys = (f"{split}_calibration_error", f"calibrated_{split}_calibration_error", f"{split}_log_loss",
            f"calibrated_{split}_log_loss")
    if any(found.get(key) is None for key in keys):
        return ""
    error, scaled_error, loss, scaled_loss = (found[key] for key in keys)
    return f"  temperature:  {calibration.scaling_text(temperature, split, error, scaled_error, loss, scaled_loss)}\n"


def describe(result: EnsembleResult) -> str:
    """The ensemble in a few lines (its accuracies beside the most-frequent-candidate baseline), and
    what to run with it."""
    test = ("" if result.test_acc is None
            else f", test {accuracy_words(result.test_acc, result.test_acc_n or 0, result.baseline_test_acc)}")
    mean = result.mean_member_valid_acc
    members = f"{len(result.members)} of {len(result.all_members)} members ({result.select})"
    valid = accuracy_words(result.valid_acc, result.valid_acc_n or 0, result.baseline_valid_acc)
    return (f"ensemble {result.name}: {members}: valid accuracy {valid}{test}"
            + ("" if mean is None else f" (members alone: {mean:.4f} on average, "
                                      f"{max(result.member_valid_acc):.4f} the best)") + "\n"
            + calibration_line(result.calibration)
            + (temperature_line(result.temperature, result.calibration, result.valid_acc == 1.0)
               if result.calibrate else "")
            + f"  folder:       {result.ensemble_dir}\n"
            + (f"  model:        {result.model_uri}\n" if result.model_uri else "")
            + next_block(result.next))
