"""What ``iaa-cli make-cloze`` says at the end: where the text's sentences went (the funnel from
sentences to windows to questions, with what each filter dropped), why a text gave few questions,
and the next commands, each runnable as printed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.data.cloze import advice
from iaa.jobs.evaluation.closing import Command, next_block
from iaa.jobs.evaluation.result import Result

# Why a window gave no question, in words (``{style}``: the word type or entities asked for).
REASONS = {
    "no_answer_in_context": "its query sentence has no {kind} that the context also holds",
    "too_few_candidates": "its context holds fewer than 9 other {kind}s to be the candidates",
    "too_few_entities": "its document names fewer than two entities",
}
KINDS = {"cbt-ne": "named-entity noun", "cbt-cn": "common noun", "cbt-v": "verb", "cbt-p": "preposition",
         "cnn": "entity"}
FEW = 0.2          # under this share of windows giving a question, the summary says why


@dataclass(frozen=True, kw_only=True)
class ClozeResult(Result):
    """``iaa-cli make-cloze``: the questions made, per split, and the funnel from sentences to
    windows to questions (``dropped``: {reason: windows}, with ``short_documents``: documents
    shorter than one window). Its ``warnings`` name each evaluation split too small to measure
    an accuracy on (``make_cloze.small_splits``); ``next``: prepare the folder, then tune or train (none
    when the valid split is empty)."""

    style: str
    out: str
    documents: dict[str, int]           # documents per split
    questions: dict[str, int]           # questions per split
    skipped_documents: int
    tokens: int
    sentences: int
    windows: int
    dropped: dict[str, int]
    tagging_seconds: float
    tokens_per_s: int
    seconds: float


def funnel(tally: Mapping[str, int], skipped: Sequence[str]) -> dict[str, Any]:
    """The JSON keys of the funnel: ``sentences`` (of the documents kept), ``windows`` tried and
    ``dropped`` ({reason: windows}, with ``short_documents``: documents shorter than one window)."""
    dropped = {k: int(tally.get(k, 0)) for k in REASONS if tally.get(k, 0)}
    return {"sentences": int(tally.get("sentences", 0)), "windows": int(tally.get("windows", 0)),
            "dropped": {**dropped, "short_documents": len(skipped)}}


def describe(result: ClozeResult) -> str:
    """The funnel in a few lines, why few questions came out when few did, and what to run next."""
    style, questions = result.style, result.questions
    total = sum(questions.values())
    per_split = ", ".join(f"{s} {n}" for s, n in questions.items())
    docs = sum(result.documents.values())
    lines = [f"make-cloze: {total} {style} questions ({per_split}) from {result.sentences} sentences "
             f"of {docs} documents; {result.windows} windows tried"]
    dropped = dict(result.dropped)
    short = dropped.pop("short_documents", 0)
    kind = KINDS.get(style, "word")
    for reason, n in sorted(dropped.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n} windows dropped: {REASONS[reason].format(kind=kind)}")
    if short:
        lines.append(f"  {short} documents dropped: shorter than one window")
    windows = result.windows
    if windows and total / windows < FEW:
        lines.append(f"  few questions: {100 * total / windows:.0f}% of the windows gave one; " + _why(style, dropped))
    return "\n".join(lines + [_next(result)])


def _why(style: str, dropped: Mapping[str, int]) -> str:
    worst = max(dropped, key=dropped.get) if dropped else ""
    if style == "cnn":
        return ("the text names few entities: a cbt-* style asks about common words instead"
                if worst == "too_few_entities" else "more text, or a smaller `stride`, tries more windows")
    if style in ("cbt-ne", "cbt-p") and worst:
        return f"{KINDS[style]}s are rare in this text: `style` cbt-cn or cbt-v finds more candidates"
    return "more text, or `stride` 1 (every window), gives more questions"


def next_commands(style: str, out: Path, questions: Mapping[str, int]) -> tuple[Command, ...]:
    """Prepare the question folder ``out``, then tune or train on it; none while its valid split is
    empty (:func:`describe` then says how to draw one)."""
    if questions.get("valid", 0) == 0:
        return ()
    prepared = advice.prepared_sibling(Path(out))
    return (Command.of("prepare", dataset=style, source=Path(out), out=prepared),
            Command.of("tune", data=prepared), Command.of("train", data=prepared))


def _next(result: ClozeResult) -> str:
    if result.next:
        return next_block(result.next)
    out = Path(result.out)
    remake = advice.empty_valid(out, advice.prepared_sibling(out))
    return f"next: the valid split is empty; {remake}" if remake else "next: give make-cloze `valid` N"
