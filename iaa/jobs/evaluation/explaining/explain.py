"""``iaa-cli explain``: per-step attention of a trained reader on chosen examples (of a prepared
split, or of a raw questions file), as a self-contained HTML page, an optional Figure-2-style PNG,
and plain records (``--json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa
from torch import nn

from iaa.data.prepared.vocab import PLACEHOLDER_ID
from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.evaluation import calibration, unknowns
from iaa.jobs.evaluation.evaluate import Examples
from iaa.jobs.evaluation.explaining.explained import ExplainedExample, ExplainedStep
from iaa.jobs.evaluation.result import Keyed, Result, absent_when_none
from iaa.jobs.modeling import precision_policy as precision_lib

if TYPE_CHECKING:
    from iaa.model.reader import StepTrace

ROUND = 6  # decimals kept in records and pages: enough to compare against the model


def select_rows(table: pa.Table, example_ids: Sequence[str], first: int | None, source: str) -> list[int]:
    """Row numbers of the requested examples, in the order asked: ids first, then the first N."""
    ids = table.column("example_id").to_pylist()
    where = {example_id: row for row, example_id in enumerate(ids)}
    missing = [e for e in example_ids if e not in where]
    if missing:
        sample = ", ".join(ids[:3])
        raise IaaError(f"no example {missing[0]!r} in {source} (its ids look like: {sample})")
    rows = [where[e] for e in example_ids]
    rows += [r for r in range(min(first or 0, len(ids))) if r not in rows]
    if not rows:
        raise IaaError("choose examples with `example_ids` ID (repeatable) or `first` N")
    return rows


def example_records(found: Examples, rows: Sequence[int]) -> list[ExplainedExample]:
    """One record per row of ``found``'s table: the words, the reader's trace of its steps
    (``forward(batch, trace=True)``: attentions, gates, ACT's halting) and the final
    distribution, at the temperature the reader answers at."""
    import torch

    from iaa.data.loading.loader import collate
    from iaa.model.pointer import candidate_probs

    model, table, tokens, kind = found.model, found.table, found.tokens, found.kind
    records = []
    model.eval()
    for row in rows:
        one = table.slice(row, 1)
        with torch.no_grad():
            out = model(collate(one), trace=True)                          # ReaderOutput
            log_p, trace = out.log_probs, out.trace                        # (1, C), Trace
        shard = one.to_pylist()[0]                                         # the row, in the shards' schema
        words = shard["candidate_words"]
        doc = [words[c] if c >= 0 else tokens[i] for i, c in zip(shard["doc"], shard["doc_cand"])]
        scaled = calibration.scaled(candidate_probs(log_p).double().numpy(), found.temperature)
        probs = [round(p, ROUND) for p in scaled[0].tolist()]
        pointed = set(shard["doc_cand"])                                   # the candidates a document word names
        named = found.names[row] if row < len(found.names) else {}
        gaps = unknowns.of_row(shard["doc"], shard["candidates"], words)
        records.append(ExplainedExample(
            example_id=shard["example_id"],
            model=kind,
            steps=len(trace.steps),
            placeholder=tokens[PLACEHOLDER_ID],
            query_tokens=tuple(tokens[i] for i in shard["query"]),
            doc_tokens=tuple(doc),
            doc_cand=tuple(shard["doc_cand"]),
            candidates=tuple(words),
            gold=shard["answer"] if shard["answer"] >= 0 else None,        # -1: the question gave none
            pred=max(range(len(probs)), key=probs.__getitem__),
            probs=tuple(probs),
            temperature=found.temperature,
            stopped_at=None if trace.halting is None else int(trace.halting.steps[0]),
            max_steps=getattr(model.cfg, "steps", 1),
            trace=tuple(_step_record(t, step) for t, step in enumerate(trace.steps, 1)),
            unknown_share=gaps["unknown_share"],
            unknown_candidates=tuple(gaps["unknown_candidates"]),
            absent_candidates=tuple(w for i, w in enumerate(words) if i not in pointed),
            entity_names={w: named[w] for w in words if w in named},
        ))
    return records


def _step_record(t: int, step: StepTrace) -> ExplainedStep:
    """Step ``t`` of the trace of one example, its values rounded to :data:`ROUND` places."""
    def values(x):
        return None if x is None else tuple(round(v, ROUND) for v in x[0].tolist())

    def scalar(x):
        return None if x is None else round(float(x[0]), ROUND)

    def mean(gate):                                               # over the 2h gate units
        return None if gate is None else gate.mean(1)

    return ExplainedStep(step=t, query_attention=values(step.query), doc_attention=values(step.doc),
                         r_q=scalar(mean(step.r_q)), r_d=scalar(mean(step.r_d)),
                         halt_prob=scalar(step.halt), weight=scalar(step.weight))


WHOLE_INPUT = 20   # an --input file of at most this many questions is explained whole without --first
MISTAKE_SCAN = 5000   # examples searched for a mistake when the chosen ones are all right
SCAN_CHUNK = 256      # examples scored at once while searching


def first_mistake(model: nn.Module, table: pa.Table, after: Sequence[int]) -> tuple[int | None, int]:
    """The row of ``table``'s first example that ``model`` gets wrong, other than the rows ``after``
    (the examples already shown), searching its first :data:`MISTAKE_SCAN` rows; and how many it searched."""
    from iaa.data.loading.loader import iter_batches
    from iaa.jobs.evaluation.evaluate import predict

    end, shown = min(table.num_rows, MISTAKE_SCAN), set(after)
    row_of = {e: r for r, e in enumerate(table.column("example_id").to_pylist())}
    for chunk in range(0, end, SCAN_CHUNK):
        part = table.slice(chunk, min(SCAN_CHUNK, end - chunk))
        wrong = [row_of[p["example_id"]] for p in predict(model, iter_batches(part, 64, seed=0, epoch=0, shuffle=False))
                 if p["gold"] >= 0 and p["pred"] != p["gold"] and row_of[p["example_id"]] not in shown]
        if wrong:
            return min(wrong), min(wrong) + 1
    return None, end


def with_a_mistake(found: Examples, records: list[ExplainedExample], rows: Sequence[int],
                   source: str) -> tuple[list[ExplainedExample], str | None]:
    """``records``, and where every one of them is right, the record of the first example after them
    that the reader gets wrong (there is something to learn from a mistake): with a note saying so
    (and where it stands in ``source``, whose ids need not be positions), or that the reader made
    none in the examples searched. Questions without an answer are not judged, and the note says so."""
    if not records or any(r.is_mistake for r in records) or all(r.gold is None for r in records):
        return records, None
    row, searched = first_mistake(found.model, found.table, rows)
    if row is not None:
        (added,) = example_records(found, [row])
        if added.is_mistake:
            above = "the example" if len(records) == 1 else f"the {len(records)} examples"
            return [*records, added], (f"{added.example_id} is added: the reader got {above} above it right, "
                                       f"and this is the first one of {source} it gets wrong "
                                       f"(question {row + 1:,} of {found.table.num_rows:,} in its order)")
    what = "every example" if searched >= found.table.num_rows else f"the first {searched:,} examples"
    unjudged = sum(r.gold is None for r in records)
    if unjudged:
        return records, (f"the reader gets {what} of {source} that give an answer right, and {unjudged} "
                         f"question(s) give none to judge: there is no mistake to show")
    return records, f"the reader gets {what} of {source} right: there is no mistake to show"


@dataclass(frozen=True, kw_only=True)
class ExplainResult(Keyed, Result):
    """``iaa-cli explain``: the page written, one record per example explained (its words, the
    reader's trace of its steps and its distribution), and the PNG where one was drawn."""

    html: str
    examples: tuple[ExplainedExample, ...]
    title: str
    precision: str                                   # what the reader multiplied in: fp32 | bf16
    temperature: float                               # the one its probabilities are at (its checkpoint's)
    mistake_note: str | None = absent_when_none()   # why a mistake was added, or that none was found
    png: str | None = absent_when_none()


def run(checkpoint_path: Path, data_dir: Path | None, split: str | None, *, example_ids: Sequence[str] = (),
        first: int | None = None, out: Path | None = None, png: Path | None = None,
        input_path: Path | None = None, workdir: Path | None = None, source: str | None = None,
        precision: str = "auto") -> ExplainResult:
    """Explain the chosen examples of a prepared split, or of the questions of ``input_path`` (all
    of them when none are chosen and there are at most :data:`WHOLE_INPUT`); write the HTML page
    (``out``, by default ``WORKDIR/evaluations/MODEL/explain-SPLIT.html``) and PNG; return the records.
    The reader computes in ``precision`` (auto | fp32 | bf16), as ``predict`` and ``evaluate`` do,
    so its probabilities are theirs.

    The first N (``first``) are followed by the first mistake past them when they are all right
    (:func:`with_a_mistake`). The page's title names the model's ``source`` (``sweep NAME, trial
    T``) where given, and always its checkpoint."""
    from iaa.jobs.workdir import outputs
    from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir
    from iaa.jobs.evaluation.evaluate import load_examples
    from iaa.jobs.evaluation.explaining.explain_html import render_page

    if not example_ids and not first and input_path is None:
        raise IaaError("choose examples with `example_ids` ID (repeatable) or `first` N")
    used = precision_lib.resolve(precision)
    found = load_examples(checkpoint_path, data_dir=data_dir, split=split, input_path=input_path,
                          todo="explain it on the data it was trained on", precision=used)
    if not example_ids and not first:                     # --input alone: every question of a small file
        if found.table.num_rows > WHOLE_INPUT:
            raise IaaError(f"{input_path} holds {found.table.num_rows} questions, more than one page shows "
                           f"({WHOLE_INPUT}); choose with `first` N or `example_ids` ID")
        first = found.table.num_rows
    if out is None:
        out = Workdir(workdir or Path(DEFAULT_WORKDIR)).evaluation(checkpoint_path) / f"explain-{found.name}.html"
    outputs.check_file_output(out, suffixes=(".html", ".htm"), what="an HTML page", inputs=found.inputs)
    if png is not None:
        outputs.check_file_output(png, suffixes=(".png",), what="a PNG image", flag="`png`",
                                  inputs={**found.inputs, "the HTML page (`out`)": out})
    where = f"the {split} split" if input_path is None else str(input_path)
    rows = select_rows(found.table, example_ids, first, where)
    records = example_records(found, rows)
    note = None
    if first:
        records, note = with_a_mistake(found, records, rows, where)
    title = f"{found.kind} on {found.title}" + (f", {source}" if source else "")
    at = "" if found.temperature == 1.0 else f", probabilities at its temperature {found.temperature:.3g}"
    atomic_write_text(out, render_page(records, title, origin=f"checkpoint {checkpoint_path} ({used}{at})", note=note))
    gaps = unknowns.warnings_of([r.example_id for r in records], [r.unknowns() for r in records])
    drawn = None
    if png is not None:
        from iaa.jobs.evaluation.explaining.explain_png import draw

        drawn = str(draw(records[0], Path(png)).resolve())
    return ExplainResult(html=str(Path(out).resolve()), examples=tuple(records), title=title, precision=used,
                         temperature=found.temperature, mistake_note=note or None,
                         warnings=(*found.warnings, *gaps), png=drawn)


def describe(result: ExplainResult) -> str:
    """What ``iaa-cli explain`` prints: each example's prediction (and halting steps), then the files."""
    lines = []
    for r in result.examples:
        cands = r.candidates
        mark = ("no answer given" if r.gold is None else "correct" if r.pred == r.gold
                else f"wrong (gold {cands[r.gold]})")
        lines.append(f"{r.example_id}: predicted {cands[r.pred]} p={r.probs[r.pred]:.3f}, {mark}; "
                     + unknowns.describe(r.unknowns()))
        if r.stopped_at is not None:
            halts = " ".join(f"{s.halt_prob:.3f}" for s in r.trace[:-1] if s.halt_prob is not None)
            lines.append(f"  stopped at step {r.stopped_at} of {r.max_steps}; halting h_t per step: {halts}")
    if result.mistake_note:
        lines.append(result.mistake_note)
    lines.append(f"html: {result.html}" + (f"\npng: {result.png}" if result.png is not None else ""))
    return "\n".join(lines)
