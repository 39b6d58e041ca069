"""``iaa-cli explain``: per-step attention of a trained reader on chosen examples, as a
self-contained HTML page, an optional Figure-2-style PNG, and plain records (``--json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
from torch import nn

from iaa.data.vocab import PLACEHOLDER_ID
from iaa.errors import IaaError
from iaa.files import atomic_write_text

ROUND = 6  # decimals kept in records and pages: enough to compare against the model


def select_rows(table: pa.Table, example_ids: Sequence[str], first: int | None, split: str) -> list[int]:
    """Row numbers of the requested examples, in the order asked: ids first, then the first N."""
    ids = table.column("example_id").to_pylist()
    where = {example_id: row for row, example_id in enumerate(ids)}
    missing = [e for e in example_ids if e not in where]
    if missing:
        sample = ", ".join(ids[:3])
        raise IaaError(f"no example {missing[0]!r} in the {split} split (its ids look like: {sample})")
    rows = [where[e] for e in example_ids]
    rows += [r for r in range(min(first or 0, len(ids))) if r not in rows]
    if not rows:
        raise IaaError("choose examples with --example-id ID (repeatable) or --first N")
    return rows


def example_records(model: nn.Module, table: pa.Table, tokens: Sequence[str], rows: Sequence[int],
                    kind: str) -> list[dict[str, Any]]:
    """One record per row: the words, the per-step trace and the final distribution."""
    from iaa.data.loader import collate
    from iaa.jobs.trace import trace_batch

    records = []
    for row in rows:
        one = table.slice(row, 1)
        batch = collate(one)
        trace = trace_batch(model, batch)
        record = one.to_pylist()[0]
        words = record["candidate_words"]
        doc = [words[c] if c >= 0 else tokens[i] for i, c in zip(record["doc"], record["doc_cand"])]
        probs = [round(p, ROUND) for p in trace.probs[0].tolist()]
        records.append({
            "example_id": record["example_id"],
            "model": kind,
            "steps": len(trace.steps),
            "placeholder": tokens[PLACEHOLDER_ID],
            "query_tokens": [tokens[i] for i in record["query"]],
            "doc_tokens": doc,
            "doc_cand": record["doc_cand"],
            "candidates": words,
            "gold": record["answer"],
            "pred": max(range(len(probs)), key=probs.__getitem__),
            "probs": probs,
            "stopped_at": None if trace.stopped is None else int(trace.stopped[0]),
            "max_steps": getattr(model.cfg, "steps", 1),
            "trace": [_step_record(t, step) for t, step in enumerate(trace.steps, 1)],
        })
    return records


def _step_record(t: int, step) -> dict[str, Any]:
    def values(x):
        return None if x is None else [round(v, ROUND) for v in x[0].tolist()]

    def scalar(x):
        return None if x is None else round(float(x[0]), ROUND)

    return {"step": t, "query_attention": values(step.query), "doc_attention": values(step.doc),
            "r_q": scalar(step.r_q), "r_d": scalar(step.r_d),
            "halt_prob": scalar(step.halt), "weight": scalar(step.weight)}


def run(checkpoint_path: Path, data_dir: Path, split: str, *, example_ids: Sequence[str] = (),
        first: int | None = None, out: Path | None = None, png: Path | None = None) -> dict[str, Any]:
    """Explain the chosen examples; write the HTML page (and PNG); return the records."""
    from iaa.data.loader import PreparedData
    from iaa.jobs import checkpoint, outputs
    from iaa.jobs.explain_html import render_page

    out = Path(out) if out is not None else Path(checkpoint_path).parent.parent / f"explain-{split}.html"
    inputs = {"the checkpoint": checkpoint_path, "a file of the prepared data": outputs.data_files(data_dir)}
    outputs.check_file_output(out, suffixes=(".html", ".htm"), what="an HTML page", inputs=inputs)
    if png is not None:
        outputs.check_file_output(png, suffixes=(".png",), what="a PNG image", flag="--png",
                                  inputs={**inputs, "the HTML page (--out)": out})
    model, cfg, state = checkpoint.load_model(Path(checkpoint_path))
    data = PreparedData.open(Path(data_dir))
    checkpoint.check_vocab(state, data.manifest.get("vocab_hash", ""), checkpoint_path, data_dir,
                           "explain it on the data it was trained on")
    table = data.table(split)
    rows = select_rows(table, example_ids, first, split)
    records = example_records(model, table, data.vocab.tokens, rows, cfg.model.kind)
    title = f"{cfg.model.kind} on {data.manifest.get('dataset', data_dir)} ({split})"
    atomic_write_text(out, render_page(records, title))
    result: dict[str, Any] = {"html": str(out), "examples": records}
    if png is not None:
        from iaa.jobs.explain_png import draw

        result["png"] = str(draw(records[0], Path(png)))
    return result
