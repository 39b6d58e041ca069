"""What a trained model says of itself in the store: the description and tags of a registered
model version (:class:`~iaa.jobs.ports.ModelCard`), and its accuracy in the words the console uses.

A card names what the model is (a reader or an ensemble, its model kind, its dataset), how good
it is (its valid accuracy with the 95% interval, beside the most-frequent-candidate baseline
where known) and where it came from (``origin``: the run, the sweep's trial or the ensemble).
"""

from __future__ import annotations

from iaa.jobs.evaluation import frequency, uncertainty
from iaa.jobs.ports import ModelCard


def accuracy_words(accuracy: float | None, n: int, baseline: float | None = None) -> str:
    """``0.4770 ± 0.0219 (n=2000, 95%) (most-frequent-candidate baseline 0.0880)``: an accuracy on
    ``n`` questions with its interval and, where known, the baseline beside it; ``-`` for none."""
    if accuracy is None:
        return "-"
    if baseline is None:
        return uncertainty.accuracy_text(accuracy, n)
    return frequency.beside(accuracy, baseline, n)


def card(*, kind: str, model: str, dataset: str, valid_acc: float | None, n: int, baseline: float | None,
         origin: str) -> ModelCard:
    """The card of a ``kind`` (``reader`` or ``ensemble``) of model kind ``model`` (``iaa``,
    ``as-reader`` ...) on ``dataset``, whose valid accuracy on ``n`` questions is ``valid_acc``
    (``baseline``: the most-frequent-candidate accuracy there, None where not measured); ``origin``
    is a sentence naming where it came from.

    Its tags are ``kind``, ``model``, ``dataset``, ``valid_acc`` (4 places, as printed),
    ``valid_acc_n`` and, where measured, ``baseline_valid_acc``."""
    article = "An" if kind[:1] in "aeiou" else "A"
    description = (f"{article} {kind} of model `{model}` on {dataset}: valid accuracy "
                   f"{accuracy_words(valid_acc, n, baseline)}. {origin}")
    tags = {"kind": kind, "model": model, "dataset": dataset, "valid_acc_n": str(n)}
    if valid_acc is not None:
        tags["valid_acc"] = f"{valid_acc:.4f}"
    if baseline is not None:
        tags["baseline_valid_acc"] = f"{baseline:.4f}"
    return ModelCard(description, tags)
