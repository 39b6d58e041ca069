"""A Figure-2-style plot of one explained example (paper, "Discussion"): the query is the title,
each row is an inference step t, query attention on the left, document attention on the right,
and the final pointer-sum distribution over the candidates underneath."""

from __future__ import annotations

from pathlib import Path

from iaa.files import atomic_path
from iaa.jobs.evaluation.explaining.explained import ExplainedExample, ExplainedStep

MAX_DOC_LABELS = 40   # document positions labelled on the x axis: the most attended ones ...
LABEL_SHARE = 0.02    # ... that reach this share of the figure's largest document weight
LABEL_FONT = 6        # points; a label is as wide as its font is high, so labels this close would overlap


def spaced_labels(ranked: list[int], gap: int) -> list[int]:
    """The positions of ``ranked`` (most attended first) that keep ``gap`` positions from every
    more attended one kept before them, at most :data:`MAX_DOC_LABELS`, in document order."""
    kept: list[int] = []
    for i in ranked:
        if len(kept) == MAX_DOC_LABELS:
            break
        if all(abs(i - j) >= gap for j in kept):
            kept.append(i)
    return sorted(kept)


def draw(record: ExplainedExample, out: Path) -> Path:
    """Write the figure for ``record`` (from ``iaa.jobs.evaluation.explaining.explain.example_records``) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = record.trace
    has_query = steps[0].query_attention is not None
    doc = np.array([s.doc_attention for s in steps])                       # (T, Ld)
    fig = plt.figure(figsize=(16, 1.0 + 0.55 * len(steps) + 2.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 4] if has_query else [0.01, 4],
                            height_ratios=[0.55 * len(steps) + 0.6, 2.2], hspace=0.9, wspace=0.06)
    fig.suptitle(" ".join(record.query_tokens), fontsize=11)
    if has_query:
        query = np.array([s.query_attention for s in steps])               # (T, Lq)
        ax_q = fig.add_subplot(grid[0, 0])
        ax_q.imshow(query, aspect="auto", cmap="Blues", vmin=0)
        ax_q.set_xticks(range(len(record.query_tokens)), record.query_tokens, rotation=90, fontsize=7)
        ax_q.set_yticks(range(len(steps)), [f"t={s.step}" for s in steps], fontsize=8)
        ax_q.set_title("query attention", fontsize=9)
    ax_d = fig.add_subplot(grid[0, 1])
    ax_d.imshow(doc, aspect="auto", cmap="Reds", vmin=0, interpolation="nearest")
    peak = doc.max(0)                                                      # (Ld,)
    width = ax_d.get_window_extent().width                                 # pixels, at the figure's dpi
    gap = max(1, int(np.ceil(LABEL_FONT * fig.dpi / 72 * 1.2 * len(peak) / width)))  # positions a label spans
    labelled = spaced_labels([i for i in np.argsort(peak)[::-1] if peak[i] >= LABEL_SHARE * peak.max()], gap)
    ax_d.set_xticks(labelled, [record.doc_tokens[i] for i in labelled], rotation=90, fontsize=LABEL_FONT)
    ax_d.set_yticks(range(len(steps)), [_step_label(s) for s in steps], fontsize=7)
    ax_d.yaxis.tick_right()
    ax_d.set_title("document attention (the most attended positions are labelled)", fontsize=9)
    _candidates(fig.add_subplot(grid[1, :]), record)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(out)


def _step_label(step: ExplainedStep) -> str:
    if step.r_q is None:
        return f"t={step.step}"
    return f"t={step.step}  r_q={step.r_q:.2f} r_d={step.r_d:.2f}"


def _candidates(ax, record: ExplainedExample) -> None:
    """Bars of the final distribution; gold green, a wrong prediction red."""
    probs, words = record.probs, record.candidates
    colours = ["#2a7d2a" if i == record.gold else "#b3261e" if i == record.pred else "#888"
               for i in range(len(probs))]
    ax.bar(range(len(probs)), probs, color=colours)
    ax.set_xticks(range(len(probs)), [w + (" (gold)" if i == record.gold else "") +
                                      (" (pred)" if i == record.pred else "") for i, w in enumerate(words)],
                  rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("P(a | Q, D)", fontsize=8)
    scaled = record.temperature
    at = "" if scaled == 1.0 else f" (at temperature {scaled:.3g})"
    ax.set_title(f"{record.model}, T = {record.steps}: final pointer-sum over the candidates{at}", fontsize=9)
