"""``iaa-cli explain``'s records: frozen and typed, printed by ``--json`` under the same keys in the
same order, and rendered by the page, the figure and the summary from their fields."""

from __future__ import annotations

import dataclasses
import json

import pytest

from iaa.jobs.evaluation.explaining import explain
from iaa.jobs.evaluation.explaining.explain_html import render_page
from iaa.jobs.evaluation.explaining.explain_png import draw
from iaa.jobs.evaluation.explaining.explained import ExplainedExample, ExplainedStep
from tests._explain import tiny_setup

EXAMPLE_KEYS = ["example_id", "model", "steps", "placeholder", "query_tokens", "doc_tokens", "doc_cand",
                "candidates", "gold", "pred", "probs", "temperature", "stopped_at", "max_steps", "trace",
                "unknown_share", "unknown_candidates", "absent_candidates", "entity_names"]
STEP_KEYS = ["step", "query_attention", "doc_attention", "r_q", "r_d", "halt_prob", "weight"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_setup(tmp_path_factory.mktemp("explain-records"))


def _halting_example(gold: int | None = 1) -> ExplainedExample:
    """An ACT reader's example stopped at its second of three steps, with an unknown candidate and an absent one."""
    steps = (ExplainedStep(step=1, query_attention=(0.25, 0.75), doc_attention=(0.5, 0.125, 0.375),
                           r_q=0.4, r_d=0.6, halt_prob=0.3, weight=0.3),
             ExplainedStep(step=2, query_attention=(0.5, 0.5), doc_attention=(0.125, 0.75, 0.125),
                           r_q=None, r_d=None, halt_prob=0.0, weight=0.7))
    return ExplainedExample(
        example_id="q<1>", model="iaa", steps=2, placeholder="XXXXX", query_tokens=("XXXXX", "ran"),
        doc_tokens=("Ann", "met", "Zed"), doc_cand=(0, -1, 1), candidates=("Ann", "Zed", "Bo"), gold=gold,
        pred=0, probs=(0.625, 0.375, 0.0), temperature=0.5, stopped_at=2, max_steps=3, trace=steps,
        unknown_share=0.3333, unknown_candidates=("Zed",), absent_candidates=("Bo",))


def test_explain_returns_frozen_records_and_json_keeps_their_keys_in_order(setup):
    prepared, ckpts = setup
    out = ckpts["iaa"].parent / "records.html"
    result = explain.run(ckpts["iaa"], prepared, "valid", first=2, out=out, precision="fp32")
    record = result.examples[0]
    assert isinstance(record, ExplainedExample) and all(isinstance(s, ExplainedStep) for s in record.trace)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.pred = 0  # type: ignore[misc]
    shown = json.loads(json.dumps(result.fields()))["examples"]
    assert [list(r) for r in shown] == [EXAMPLE_KEYS] * len(result.examples)
    assert all(list(s) == STEP_KEYS for r in shown for s in r["trace"])
    assert shown[0]["probs"] == list(record.probs) and shown[0]["trace"][0]["doc_attention"] == list(
        record.trace[0].doc_attention)


def test_the_page_figure_and_summary_render_a_record_built_by_hand(tmp_path):
    record = _halting_example()
    page = render_page([record, _halting_example(gold=None)], "iaa on tiny")
    assert 'data-example="q&lt;1&gt;"' in page and "verdict wrong" in page and "verdict none" in page
    assert 'data-score="0/1"' in page and "halted at step 2 (adaptive, ACT)" in page
    assert 'data-halt="0.3"' in page and "no halting unit (last step)" in page
    assert "33% of the document is unknown" in page and "not in the document, so probability 0: Bo" in page
    assert 'data-cand="Bo" data-p="0.0"><td>Bo<span class="mark absent">' in page
    assert '<span class="w c" data-w="0.5"' in page and '<span class="w ph" data-w="0.25"' in page

    png = draw(record, tmp_path / "fig.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    result = explain.ExplainResult(html="p.html", examples=(record,), title="t", precision="fp32", temperature=0.5)
    lines = explain.describe(result).splitlines()
    assert lines[0] == ("q<1>: predicted Ann p=0.625, wrong (gold Zed); 33% of the document unknown, "
                        "unknown candidates: Zed")
    assert lines[1] == "  stopped at step 2 of 3; halting h_t per step: 0.300"
    last = json.loads(json.dumps(result.fields()))["examples"][0]["trace"][-1]
    assert last == {"step": 2, "query_attention": [0.5, 0.5], "doc_attention": [0.125, 0.75, 0.125],
                    "r_q": None, "r_d": None, "halt_prob": 0.0, "weight": 0.7}
