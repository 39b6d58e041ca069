"""The explain page: one self-contained HTML file (inline CSS, no script, no external resource).

Each attention weight is the colour intensity of its word, scaled by the step's largest weight
so that the peak is always fully coloured; the exact value is in the word's ``data-w`` attribute
and its tooltip. Query attention is blue, document attention red, as in the paper's Figure 2.
"""

from __future__ import annotations

from html import escape
from typing import Mapping, Sequence

from iaa.jobs.evaluation.explaining.explained import ExplainedExample, ExplainedStep

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 6px;border-top:1px solid #ddd;padding-top:14px}
.meta{color:#666;font-size:12px}
.cands{border-collapse:collapse;margin:8px 0 14px;font-size:13px}
.cands td{padding:2px 8px;border-bottom:1px solid #eee}
.bar{display:inline-block;height:10px;background:#555;vertical-align:middle}
.gold td{font-weight:600}.mark{font-size:12px;color:#fff;border-radius:3px;padding:0 4px;margin-left:4px}
.mg{background:#2a7d2a}.mp{background:#b3261e}.mp.ok{background:#2a7d2a}
.step{display:grid;grid-template-columns:70px 1fr;gap:4px 12px;margin:10px 0;padding:8px;background:#fafafa;border:1px solid #eee;border-radius:4px}
.t{font-weight:600}.gates{font-size:12px;color:#555}
.q,.d{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;line-height:1.9}
.w{padding:1px 1px;border-radius:2px}
.q{padding-bottom:4px;margin-bottom:4px;border-bottom:1px dashed #ddd}
.q::before,.d::before{display:inline-block;width:76px;font:11px system-ui,sans-serif;color:#888}
.q::before{content:"query"}.d::before{content:"document"}
.gold .bar{background:#2a7d2a}
.q .w{background:rgba(31,119,180,var(--a))}.d .w{background:rgba(214,39,40,var(--a))}
.c{text-decoration:underline dotted #888}.ph{outline:1px solid #1f77b4}
.legend{font-size:12px;color:#555;margin:4px 0 0}
.origin{font-size:13px;color:#444;margin:0 0 2px;word-break:break-all}
.note{font-size:13px;background:#fff6e0;border:1px solid #f0d890;border-radius:4px;padding:6px 10px;margin:10px 0}
.verdict{font-size:12px;font-weight:600;border-radius:3px;padding:1px 6px;margin-left:8px;vertical-align:middle}
.verdict.right{background:#e3f3e3;color:#2a7d2a}.verdict.wrong{background:#fbe4e2;color:#b3261e}
.verdict.none{background:#eee;color:#555}.mp.open{background:#555}.mark.unk,.mark.absent{background:#8a6d00}
.gaps{font-size:12px;color:#8a6d00;margin:2px 0}
.name{color:#555;margin-left:6px;font-size:12px}
"""


def render_page(records: Sequence[ExplainedExample], title: str, *, origin: str = "", note: str | None = None) -> str:
    """The whole page for ``records`` from ``iaa.jobs.evaluation.explaining.explain.example_records``: ``title``
    (the model, its data and where it comes from: a sweep's trial), then ``origin`` (its checkpoint)
    in the window's title and under the heading, and a ``note`` (why an example was added)."""
    body = "".join(_example(r) for r in records)
    right = sum(r.gold is not None and r.pred == r.gold for r in records)
    answered = sum(r.gold is not None for r in records)
    score = f"{right} of {answered} right" if answered else "no answers given"
    full = f"{title}: {origin}" if origin else title
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(full)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
            + (f"<div class=\"origin\">{escape(origin)}</div>" if origin else "")
            + f"<div class=\"meta\" data-score=\"{right}/{answered}\">{len(records)} examples, {score}</div>"
            + (f"<p class=\"note\">{escape(note)}</p>" if note else "")
            +
            "<p class=\"legend\">Each row is an inference step t. Blue: query attention q<sub>i,t</sub>; red: "
            "document attention d<sub>i,t</sub> (colour scaled to the step's largest weight; hover a word for "
            "its value, and an entity's real name where the question gives it). r<sub>q</sub>, r<sub>d</sub>: mean search-gate values. Dotted underline: a candidate.</p>"
            f"{body}</body></html>\n")


def _example(r: ExplainedExample) -> str:
    steps = "".join(_step(r, s) for s in r.trace)
    return (f"<section class=\"example\" data-example=\"{escape(r.example_id)}\">"
            f"<h2>{escape(r.example_id)}{_verdict(r)}</h2>"
            f"<div class=\"meta\">{escape(r.model)} · {_steps_taken(r)} · query: "
            f"{escape(' '.join(r.query_tokens))}</div>{_gaps(r)}{_candidates(r)}{steps}</section>")


def _gaps(r: ExplainedExample) -> str:
    """What the reader could not see of the question: its document's unknown words, its unknown
    candidates (``<unk>`` to the reader), and the candidates absent from its document (probability 0)."""
    share, unknown, absent = r.unknown_share, r.unknown_candidates, r.absent_candidates
    parts = ([f"{100 * share:.0f}% of the document is unknown to the vocabulary (&lt;unk&gt;)"] if share else []) + \
            ([f"unknown candidates: {escape(', '.join(unknown))}"] if unknown else []) + \
            ([f"not in the document, so probability 0: {escape(', '.join(absent))}"] if absent else [])
    return f"<div class=\"gaps\" data-gaps=\"{len(unknown)}/{len(absent)}\">{'; '.join(parts)}</div>" if parts else ""


def _verdict(r: ExplainedExample) -> str:
    if r.gold is None:
        return " <span class=\"verdict none\">no answer given</span>"
    if r.pred == r.gold:
        return " <span class=\"verdict right\">right</span>"
    return (f" <span class=\"verdict wrong\">wrong: predicted {escape(_named(r, r.candidates[r.pred]))}, "
            f"gold {escape(_named(r, r.candidates[r.gold]))}</span>")


def _named(r: ExplainedExample, word: str) -> str:
    """``word``, with its real name where the question gives one: ``@entity3 (Ann Lee)``."""
    name = r.entity_names.get(word)
    return f"{word} ({name})" if name else word


def _steps_taken(r: ExplainedExample) -> str:
    if r.stopped_at is None:
        return f"T = {r.steps}"
    return f"halted at step {r.stopped_at} (adaptive, ACT)"


def _candidates(r: ExplainedExample) -> str:
    """The final pointer-sum distribution, best first, gold and predicted marked."""
    order = sorted(range(len(r.probs)), key=lambda i: -r.probs[i])
    unknown, absent_ones = set(r.unknown_candidates), set(r.absent_candidates)
    rows = []
    for i in order:
        p, word = r.probs[i], r.candidates[i]
        marks = ""
        if i == r.gold:
            marks += "<span class=\"mark mg\">gold</span>"
        if i == r.pred:
            ok = " ok" if i == r.gold else " open" if r.gold is None else ""
            marks += f"<span class=\"mark mp{ok}\">predicted</span>"
        if word in unknown:
            marks += "<span class=\"mark unk\">unknown</span>"
        absent = word in absent_ones
        if absent:
            marks += "<span class=\"mark absent\">not in the document</span>"
        cls = " class=\"gold\"" if i == r.gold else ""
        name = r.entity_names.get(word)
        named = f"<span class=\"name\">{escape(name)}</span>" if name else ""
        rows.append(f"<tr{cls} data-cand=\"{escape(word)}\" data-p=\"{p}\"><td>{escape(word)}{named}"
                    f"{marks}</td><td>{probability(p, absent)}</td><td><span class=\"bar\" style=\"width:{300 * p:.1f}px\"></span></td></tr>")
    return f"<table class=\"cands\">{''.join(rows)}</table>"


def probability(p: float, absent: bool = False) -> str:
    """``0.9731``; below 0.0001, two significant digits (``3.2e-06``) rather than ``0.0000``. A
    record keeps 6 decimals: a 0 there is exactly 0 only for a candidate ``absent`` from the
    document, and below 0.000001 for any other."""
    if p == 0:
        return "0" if absent else "&lt;1e-06"
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def _step(r: ExplainedExample, s: ExplainedStep) -> str:
    gates = "no gates (last step)" if s.r_q is None else f"r<sub>q</sub> {s.r_q:.3f}<br>r<sub>d</sub> {s.r_d:.3f}"
    if r.model == "as-reader":
        gates = "one step"
    if s.halt_prob is not None:
        halt = "no halting unit (last step)" if s.r_q is None else f"halt h<sub>t</sub> {s.halt_prob:.3f}"
        gates += f"<br><span data-halt=\"{s.halt_prob}\">{halt}</span><br>weight p<sub>t</sub> {s.weight:.3f}"
    query = (_tokens(r.query_tokens, s.query_attention, "q", placeholder=r.placeholder, names=r.entity_names)
             if s.query_attention is not None else "<div class=\"q\">(final encoder states, no query attention)</div>")
    doc = _tokens(r.doc_tokens, s.doc_attention, "d", cand=r.doc_cand, names=r.entity_names)
    return (f"<div class=\"step\" data-step=\"{s.step}\"><div><div class=\"t\">t = {s.step}</div>"
            f"<div class=\"gates\">{gates}</div></div><div>{query}{doc}</div></div>")


def _tokens(words: Sequence[str], weights: Sequence[float], kind: str, *, placeholder: str | None = None,
            cand: Sequence[int] | None = None, names: Mapping[str, str] | None = None) -> str:
    """The words of the query or the document, each coloured by its weight; its tooltip gives the
    weight, after the word's real name where ``names`` has one (a CNN entity)."""
    peak = max(weights, default=0.0) or 1.0
    names = names or {}
    spans = []
    for i, (word, w) in enumerate(zip(words, weights)):
        cls = "w"
        if cand is not None and cand[i] >= 0:
            cls += " c"
        if word == placeholder:
            cls += " ph"
        tip = f"{names[word]}: {w:.4f}" if word in names else f"{w:.4f}"
        spans.append(f"<span class=\"{cls}\" data-w=\"{w}\" title=\"{escape(tip)}\" style=\"--a:{w / peak:.3f}\">"
                     f"{escape(word)}</span>")
    return f"<div class=\"{kind}\" data-kind=\"{kind}\">{' '.join(spans)}</div>"
