"""How ``iaa-cli train`` ends: the best accuracy with its error bar and the baseline, why the run
stopped (in words, with the setting that gives it more when it was still improving), where its
files are, and the next commands, each runnable as printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from iaa.jobs.evaluation import closing, frequency, uncertainty


def with_baseline(result: Mapping[str, Any], prepared: Path) -> dict[str, Any]:
    """``result`` with the most-frequent-candidate accuracy on the valid split beside its best
    accuracy (a warning when the reader is not above it), the split's size, the accuracy's
    standard error, the data folder and whether it has a test split."""
    from iaa.data.loader import PreparedData

    baseline = frequency.run(prepared, "valid")
    base, acc, n = baseline["accuracy"], result.get("best_valid_acc"), baseline["examples"]
    warnings = frequency.below_warning(acc, base, "the run") if acc is not None else []
    return {**result, "baseline_valid_acc": base, "warnings": [*result.get("warnings", []), *warnings],
            "valid_examples": n, **uncertainty.fields("best_valid_acc", acc, n), "data_dir": str(prepared),
            "has_test": "test" in PreparedData.open(Path(prepared)).splits}


def describe(result: Mapping[str, Any], req: Any = None, what: str = "train") -> str:
    """The closing lines of a training run (``result``: the train job's), with the next commands."""
    acc, n = result.get("best_valid_acc"), int(result.get("valid_examples") or 0)
    base = result.get("baseline_valid_acc")
    shown = ("-" if acc is None else frequency.beside(acc, base, n) if base is not None
             else uncertainty.accuracy_text(acc, n))
    lines = [f"{what}: best valid accuracy {shown}",
             f"  at step {result.get('best_step', '?')} of {result.get('steps', '?')}, epoch "
             f"{closing.rounded(float(result.get('epoch', 0.0)))}; "
             + closing.stop_words(result, _epochs(result)),
             f"  checkpoint:   {result.get('checkpoint', '')}"]
    if result.get("model_uri"):
        lines.append(f"  model:        {result['model_uri']}")
    return "\n".join(lines + [closing.next_block(next_commands(result, req))])


def next_commands(result: Mapping[str, Any], req: Any = None, *, ensemble: bool = True) -> list[closing.Command]:
    """Score the checkpoint on test, explain it on valid, and (``ensemble``) ensemble it."""
    ckpt, data = result.get("checkpoint", ""), result.get("data_dir", "")
    at = closing.where(getattr(req, "workdir", None), getattr(req, "tracking_uri", None))
    split = "test" if result.get("has_test") else "valid"
    return [closing.Command.of("evaluate", checkpoint=ckpt, data=data, split=split),
            closing.Command.of("explain", checkpoint=ckpt, data=data, first=5),
            *([closing.Command.of("ensemble", members=(ckpt,), data=data, **at)] if ensemble else [])]


def _epochs(result: Mapping[str, Any]) -> float | None:
    epoch = result.get("epoch")
    return round(float(epoch) + 0.5) if isinstance(epoch, (int, float)) and epoch > 0 else None
