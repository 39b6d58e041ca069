"""``iaa-cli explain``: the page is self-contained and shows the model's own attention values."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data.loading.loader import PreparedData, collate
from iaa.jobs.modeling import checkpoint
from iaa.model.pointer import candidate_probs, pointer_sum
from tests._explain import tiny_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_setup(tmp_path_factory.mktemp("explain"))


class _Page(HTMLParser):
    """Collects, per example and step, the data-w values of query and document words."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[tuple[str, int, str], list[float]] = {}
        self.probs: dict[str, dict[str, float]] = {}
        self.example, self.step, self.kind = "", 0, ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-example" in a:
            self.example = a["data-example"]
        if "data-step" in a:
            self.step = int(a["data-step"])
        if "data-kind" in a:
            self.kind = a["data-kind"]
        if "data-w" in a:
            self.values.setdefault((self.example, self.step, self.kind), []).append(float(a["data-w"]))
        if "data-p" in a:
            self.probs.setdefault(self.example, {})[a["data-cand"]] = float(a["data-p"])


def _explain(args: list[str]) -> dict:
    result = CliRunner().invoke(cli, ["explain", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    for example in shown["examples"]:             # the summary stays on stderr with --json
        assert f"{example['example_id']}: predicted " in result.stderr
    return shown


@pytest.mark.parametrize("kind,steps", [("iaa", 3), ("iaa-fixed-query", 2), ("as-reader", 1)])
def test_page_shows_the_models_values(setup, tmp_path, kind, steps):
    prepared, ckpts = setup
    out = tmp_path / "page.html"
    result = _explain(["--checkpoint", str(ckpts[kind]), "--data", str(prepared), "--split", "valid",
                       "--first", "2", "--out", str(out)])
    html = out.read_text(encoding="utf-8")
    for external in ("<script", "http:", "https:", "<link", "@import", "url("):
        assert external not in html
    page = _Page()
    page.feed(html)
    assert len(result["examples"]) == 2
    for r in result["examples"]:
        assert r["steps"] == len(r["trace"]) == steps
        assert math.isclose(sum(r["probs"]), 1.0, abs_tol=1e-4)
        assert r["pred"] == max(range(len(r["probs"])), key=r["probs"].__getitem__)
        for s in r["trace"]:
            assert page.values[(r["example_id"], s["step"], "d")] == pytest.approx(s["doc_attention"], abs=1e-6)
            assert math.isclose(sum(s["doc_attention"]), 1.0, abs_tol=1e-4)
            if kind == "as-reader":
                assert s["query_attention"] is None
            else:
                assert page.values[(r["example_id"], s["step"], "q")] == pytest.approx(s["query_attention"], abs=1e-6)
                assert math.isclose(sum(s["query_attention"]), 1.0, abs_tol=1e-4)
            gated = kind != "as-reader" and s["step"] < steps
            assert (s["r_q"] is not None) == gated and (s["r_d"] is not None) == gated
        assert page.probs[r["example_id"]] == pytest.approx(dict(zip(r["candidates"], r["probs"])), abs=1e-6)
    section = html.split(f'data-example="{result["examples"][0]["example_id"]}"')[1].split("</table>")[0]
    assert "gold</span>" in section and "predicted</span>" in section


def test_fixed_query_attention_is_uniform(setup):
    prepared, ckpts = setup
    result = _explain(["--checkpoint", str(ckpts["iaa-fixed-query"]), "--data", str(prepared), "--first", "1",
                       "--out", str(Path(ckpts["iaa"]).parent / "fq.html")])
    q = result["examples"][0]["trace"][0]["query_attention"]
    assert q == pytest.approx([1 / len(q)] * len(q), abs=1e-6)


def test_the_trace_is_the_forward_pass_on_a_padded_batch(setup):
    """``forward(batch, trace=True)`` on several padded examples: the answer it gives is the one
    without the trace (where inference may run the C++ steps), and it is the pointer-sum of the
    last step's document attention; attentions are 0 on padding and sum to 1, gates lie in
    (0, 1) on every step but the last."""
    prepared, ckpts = setup
    model, _, _ = checkpoint.load_model(ckpts["iaa"])
    batch = collate(PreparedData.open(prepared).table("valid").slice(0, 8))
    with torch.no_grad():
        out = model(batch, trace=True)
        log_p, trace = out.log_probs, out.trace
        plain = model(batch).log_probs
    probs = candidate_probs(log_p)
    assert torch.allclose(probs, candidate_probs(plain), atol=1e-4)
    answer = pointer_sum(trace.steps[-1].doc.log(), batch.doc_cand, batch.cand_mask.shape[1])
    assert torch.allclose(candidate_probs(answer), probs, atol=1e-5)
    assert len(trace.steps) == model.cfg.steps and trace.halting is None
    for step in trace.steps:
        assert (step.doc[~batch.doc_mask] == 0).all() and (step.query[~batch.query_mask] == 0).all()
        assert torch.allclose(step.query.sum(1), torch.ones(8)) and torch.allclose(step.doc.sum(1), torch.ones(8))
    for step in trace.steps[:-1]:
        assert step.r_q.shape == step.r_d.shape == (8, 2 * model.cfg.hidden_dim)
        assert ((step.r_q > 0) & (step.r_q < 1)).all()
    assert trace.steps[-1].r_q is None


def test_several_ids_and_png(setup, tmp_path):
    prepared, ckpts = setup
    ids = PreparedData.open(prepared).table("valid").column("example_id").to_pylist()
    png = tmp_path / "fig.png"
    result = _explain(["--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--example-id", ids[5],
                       "--example-id", ids[2], "--out", str(tmp_path / "p.html"), "--png", str(png)])
    assert [r["example_id"] for r in result["examples"]] == [ids[5], ids[2]]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_unknown_example_is_a_clear_error(setup, tmp_path):
    prepared, ckpts = setup
    result = CliRunner().invoke(cli, ["explain", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared),
                                      "--example-id", "nope", "--out", str(tmp_path / "x.html")])
    assert result.exit_code != 0 and "no example 'nope' in the valid split" in result.output
    result = CliRunner().invoke(cli, ["explain", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared)])
    assert result.exit_code != 0 and "--first N" in result.output


def _questions(root: Path, n: int) -> list[dict]:
    from iaa.data.formats import cbt

    examples = cbt.read(root / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()[:n]
    return [{"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
             "candidates": list(ex.candidates)} for ex in examples]


def _answered(setup, tmp_path, right: int) -> tuple[Path, Path, list[dict]]:
    """The iaa checkpoint with its vocabulary (as training saves it), and eight questions whose
    answers are its own predictions for the first ``right`` of them and another candidate for the rest."""
    from iaa.data.prepared.manifest import vocab_card

    prepared, ckpts = setup
    ckpt = checkpoint.save(tmp_path / "with-vocab.pt", {**checkpoint.load(ckpts["iaa"]), "vocab": vocab_card(prepared)})
    questions = _questions(prepared.parent, 8)
    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(cli, ["predict", "--checkpoint", str(ckpt), "--input", str(source), "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    predicted = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
    for i, (q, p) in enumerate(zip(questions, predicted)):
        q["answer"] = p if i < right else next(c for c in q["candidates"] if c != p)
    source.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    return ckpt, source, questions


def test_the_page_shows_a_mistake_when_the_first_ones_are_right(setup, tmp_path):
    """The first N all right: the first example the reader gets wrong is added to the page."""
    ckpt, source, questions = _answered(setup, tmp_path, right=3)
    out = tmp_path / "page.html"
    result = _explain(["--checkpoint", str(ckpt), "--input", str(source), "--first", "2", "--out", str(out)])
    assert [r["example_id"] for r in result["examples"]] == [q["id"] for q in (questions[0], questions[1], questions[3])]
    assert [r["pred"] != r["gold"] for r in result["examples"]] == [False, False, True]
    html = out.read_text(encoding="utf-8")
    assert f'data-example="{questions[3]["id"]}"' in html and "verdict wrong" in html


def test_a_page_of_right_answers_says_there_is_no_mistake(setup, tmp_path):
    ckpt, source, _ = _answered(setup, tmp_path, right=8)
    out = tmp_path / "page.html"
    result = _explain(["--checkpoint", str(ckpt), "--input", str(source), "--first", "2", "--out", str(out)])
    assert len(result["examples"]) == 2
    assert "no mistake to show" in out.read_text(encoding="utf-8")


def test_a_question_without_an_answer_is_not_judged_and_what_the_reader_cannot_see_is_marked(setup, tmp_path):
    """An --input of an answered question the reader gets right and one that gives no answer, with
    an unknown candidate and one absent from its document: the page does not call the reader
    right on every example, marks the unanswered one as such, and names both candidates."""
    from _faults import assert_says

    ckpt, source, questions = _answered(setup, tmp_path, right=1)
    open_question = {key: value for key, value in questions[1].items() if key != "answer"}
    open_question["candidates"] = [*open_question["candidates"], "Zorblax", open_question["candidates"][0] + "x"]
    open_question["document"] += " Zorblax"
    source.write_text(json.dumps(questions[0]) + "\n" + json.dumps(open_question) + "\n", encoding="utf-8")
    out = tmp_path / "page.html"
    result = _explain(["--checkpoint", str(ckpt), "--input", str(source), "--out", str(out)])
    assert_says(result["mistake_note"], "that give an answer right", "1 question(s) give none to judge")
    html = out.read_text(encoding="utf-8")
    assert html.count("verdict right") == 1 and html.count("verdict none") == 1 and "verdict wrong" not in html
    assert "mp open" in html                                  # its prediction is not marked as a mistake
    (unanswered,) = [r for r in result["examples"] if r["gold"] is None]
    assert "Zorblax" in unanswered["unknown_candidates"]
    assert unanswered["absent_candidates"] == [open_question["candidates"][-1]]
    section = html.split(f'data-example="{open_question["id"]}"')[1]
    assert "unknown candidates: Zorblax" in section and "not in the document, so probability 0" in section
    assert 'class="mark absent"' in section and 'class="mark unk"' in section


def test_probabilities_are_shown_without_hiding_small_ones():
    from iaa.jobs.evaluation.explaining.explain_html import probability

    assert [probability(p) for p in (0.97312, 0.00012, 3.2e-06)] == ["0.9731", "0.0001", "3.2e-06"]
    assert probability(0.0, absent=True) == "0" and probability(0.0) == "&lt;1e-06"


def test_the_page_names_its_sweep_trial_and_checkpoint(setup, tmp_path):
    from iaa.jobs.evaluation.explaining import explain

    prepared, ckpts = setup
    out = tmp_path / "page.html"
    explain.run(ckpts["iaa"], prepared, "valid", first=1, out=out, source="sweep demo-iaa-1, trial-0003")
    title = out.read_text(encoding="utf-8").split("<title>")[1].split("</title>")[0]
    assert "sweep demo-iaa-1, trial-0003" in title and str(ckpts["iaa"]) in title
    _explain(["--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--first", "1", "--out", str(out)])
    assert str(ckpts["iaa"]) in out.read_text(encoding="utf-8").split("<title>")[1].split("</title>")[0]


def test_the_figures_document_labels_keep_apart_most_attended_first():
    from iaa.jobs.evaluation.explaining.explain_png import MAX_DOC_LABELS, spaced_labels

    assert spaced_labels([10, 11, 3, 12, 40], gap=2) == [3, 10, 12, 40]     # 11 would sit on 10's label
    assert spaced_labels([5, 6, 7], gap=1) == [5, 6, 7]                     # room for every one
    assert len(spaced_labels(list(range(0, 1000, 3)), gap=3)) == MAX_DOC_LABELS
