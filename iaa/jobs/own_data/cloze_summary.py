"""What ``iaa-cli make-cloze`` says at the end: where the text's sentences went (the funnel from
sentences to windows to questions, with what each filter dropped), why a text gave few questions,
and the next commands, each runnable as printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.data.cloze import advice
from iaa.jobs.evaluation.closing import Command, next_block

# Why a window gave no question, in words (``{style}``: the word type or entities asked for).
REASONS = {
    "no_answer_in_context": "its query sentence has no {kind} that the context also holds",
    "too_few_candidates": "its context holds fewer than 9 other {kind}s to be the candidates",
    "too_few_entities": "its document names fewer than two entities",
}
KINDS = {"cbt-ne": "named-entity noun", "cbt-cn": "common noun", "cbt-v": "verb", "cbt-p": "preposition",
         "cnn": "entity"}
FEW = 0.2          # under this share of windows giving a question, the summary says why


def funnel(tally: Mapping[str, int], skipped: Sequence[str]) -> dict[str, Any]:
    """The JSON keys of the funnel: ``sentences`` (of the documents kept), ``windows`` tried and
    ``dropped`` ({reason: windows}, with ``short_documents``: documents shorter than one window)."""
    dropped = {k: int(tally.get(k, 0)) for k in REASONS if tally.get(k, 0)}
    return {"sentences": int(tally.get("sentences", 0)), "windows": int(tally.get("windows", 0)),
            "dropped": {**dropped, "short_documents": len(skipped)}}


def describe(result: Mapping[str, Any]) -> str:
    """The funnel in a few lines, why few questions came out when few did, and what to run next."""
    style, questions = result["style"], result["questions"]
    total = sum(questions.values())
    per_split = ", ".join(f"{s} {n}" for s, n in questions.items())
    docs = sum(result["documents"].values())
    lines = [f"make-cloze: {total} {style} questions ({per_split}) from {result.get('sentences', 0)} sentences "
             f"of {docs} documents; {result.get('windows', 0)} windows tried"]
    dropped = dict(result.get("dropped") or {})
    short = dropped.pop("short_documents", 0)
    kind = KINDS.get(style, "word")
    for reason, n in sorted(dropped.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n} windows dropped: {REASONS[reason].format(kind=kind)}")
    if short:
        lines.append(f"  {short} documents dropped: shorter than one window")
    windows = result.get("windows", 0)
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


def _next(result: Mapping[str, Any]) -> str:
    out = Path(result["out"])
    prepared = advice.prepared_sibling(out)
    if result["questions"].get("valid", 0) == 0:
        remake = advice.empty_valid(out, prepared)
        return f"next: the valid split is empty; {remake}" if remake else "next: give make-cloze `valid` N"
    return next_block([advice.prepare_command(result["style"], out),
                       Command.of("tune", data=prepared), Command.of("train", data=prepared)])
