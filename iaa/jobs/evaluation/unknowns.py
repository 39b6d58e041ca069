"""How much of a question the vocabulary does not know.

A word outside the reader's vocabulary reaches it as ``<unk>``: the reader sees one token for all
of them. A document that is mostly ``<unk>`` still gets a confident distribution over its
candidates, but that confidence rests on the vocabulary's gaps, not on what the text says. Each
answered question therefore carries ``unknown_share`` (the fraction of its document's words that
are ``<unk>``) and ``unknown_candidates`` (the candidates that are), and above
:data:`UNKNOWN_WARN_SHARE` of the document a warning says so.
"""

from __future__ import annotations

from typing import Any, Sequence

from iaa.data.prepared.vocab import UNK

UNKNOWN_WARN_SHARE = 1 / 3     # a document more than a third <unk>: the answer rests on the gaps


def of_row(doc: Sequence[int], candidates: Sequence[int], candidate_words: Sequence[str]) -> dict[str, Any]:
    """``{"unknown_share", "unknown_candidates"}`` of one question: its document's share of
    ``<unk>`` ids (0.0 for an empty document), rounded to 4 places, and its unknown candidates."""
    share = sum(i == UNK for i in doc) / len(doc) if len(doc) else 0.0
    return {"unknown_share": round(share, 4),
            "unknown_candidates": [w for i, w in zip(candidates, candidate_words) if i == UNK]}


def of_table(table: Any) -> list[dict[str, Any]]:
    """:func:`of_row` of each row of a table in the shards' schema, in order."""
    return [of_row(d, c, w) for d, c, w in zip(table.column("doc").to_pylist(), table.column("candidates").to_pylist(),
                                                table.column("candidate_words").to_pylist())]


def warning(example_id: str, info: dict[str, Any]) -> str | None:
    """The warning for a question whose document is more than :data:`UNKNOWN_WARN_SHARE` unknown; else None."""
    share = info["unknown_share"]
    if share <= UNKNOWN_WARN_SHARE:
        return None
    cands = info["unknown_candidates"]
    also = f"; unknown candidates: {', '.join(cands[:10])}" if cands else ""
    return (f"{example_id}: {100 * share:.0f}% of its document is unknown to the reader's vocabulary (<unk>), so "
            f"its answer rests on the vocabulary's gaps, not on the text{also}")


def warnings_of(ids: Sequence[str], infos: Sequence[dict[str, Any]]) -> list[str]:
    """The warnings of the questions above the threshold, in order."""
    return [w for i, info in zip(ids, infos) if (w := warning(i, info)) is not None]


def annotated(row: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """An answer ``row`` (with its ``id``) and ``info``, plus its ``warning`` when above the threshold."""
    note = warning(str(row.get("id", "")), info)
    return {**row, **info, **({"warning": note} if note else {})}


def describe(info: dict[str, Any]) -> str:
    """``12% of the document unknown`` and the unknown candidates, for a line of output."""
    cands = info.get("unknown_candidates") or []
    return (f"{100 * info.get('unknown_share', 0.0):.0f}% of the document unknown"
            + (f", unknown candidates: {', '.join(cands[:10])}" if cands else ""))
