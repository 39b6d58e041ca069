"""Fault suite, serve: every check that can fail one request runs in the ingress, before any
batch, and answers 400/413/422 naming the field; a bad request mixed into good traffic fails
alone (a chunked body over the limit among them, refused while it is read);
a failure inside the model fails only its request; the API is described by OpenAPI."""

from __future__ import annotations

import http.client
import json
import os
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from iaa.jobs.inference import serve as job
from tests._processes import process_tree, resident_mib
from tests.test_serve import QUESTION, post_question, answerer, served, setup  # noqa: F401 - fixtures

LIMITS = job.Limits(max_document_words=200)        # the served fixture's limits (other limits: defaults)


def _body(value) -> bytes:
    return json.dumps(value).encode()


# (body, status, what the error names); each fails exactly one check, and each check here ran in
# the batch or not at all before, failing the requests batched with it.
BAD = {
    "duplicate-candidates": (_body({**QUESTION, "candidates": ["cat", "dog", "cat"]}), 422,
                             "question: candidate(s) ['cat'] listed more than once"),
    "two-placeholders": (_body({**QUESTION, "query": "the XXXXX ran to the XXXXX"}), 422,
                         "question: the query has 2 XXXXX placeholders"),
    "long-query": (_body({**QUESTION, "query": "XXXXX " + "the " * 500}), 413, "query: 501 words, over the limit of 500"),
    "long-document": (_body({**QUESTION, "document": "the cat " * 101}), 413, "document: 202 words, over the limit of 200"),
    "many-candidates": (_body({**QUESTION, "candidates": ["cat", "dog", *(f"c{i}" for i in range(999))]}), 413,
                        "candidates: 1001 candidates, over the limit of 1000"),
    "wrong-type": (_body([QUESTION, {**QUESTION, "query": 3}]), 400, "[2].query: expected a string, got a number"),
    "deep-nesting": (b'{"document": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested too deeply"),
    "5000-digit-id": (_body(QUESTION)[:-1] + b', "id": ' + b"9" * 5000 + b"}", 400,
                      "id: expected a string or an integer, got a number of 5,000 digits"),
    "lone-surrogate": (_body({**QUESTION, "document": "the cat \ud800 sat"}), 400,
                       "document holds a lone surrogate (\\ud800 at character 9)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_the_checks_of_a_request_run_before_any_batch(answerer, case):
    body, status, what = BAD[case]
    with pytest.raises(job.RequestError) as caught:
        answerer.parse(body, LIMITS)
    assert caught.value.status == status and what in str(caught.value), str(caught.value)
    assert len(str(caught.value)) < 300


def test_the_request_limits_come_from_the_config(tmp_path):
    cfg = job.config(model_uri=None, checkpoint=tmp_path / "m.pt", ensemble_dir=None, data_dir=None, workdir=tmp_path,
                     tracking_uri=None, max_document_words=10, max_query_words=5, max_candidates=3)
    assert (cfg.limits.max_document_words, cfg.limits.max_query_words, cfg.limits.max_candidates) == (10, 5, 3)
    with pytest.raises(job.IaaError, match="max_candidates must be a whole number >= 1"):
        job.Limits(max_candidates=0)


class _FailsOn:
    """A predictor that fails on any batch holding the question ``bad``."""

    def __init__(self, predictor, bad: str) -> None:
        self.predictor, self.bad, self.vocab, self.lowercase = predictor, bad, predictor.vocab, predictor.lowercase

    def predict(self, questions):
        if any(q.example.example_id == self.bad for q in questions):
            raise RuntimeError("boom")
        return self.predictor.predict(questions)


def test_a_model_failure_on_one_request_fails_only_that_request(answerer):
    failing = job.Answerer(_FailsOn(answerer.predictor, "bad"), "m", "1")
    requests = [answerer.parse(_body({**QUESTION, "id": name}))[0] for name in ("a", "bad", "c")]
    out = failing.answer(requests)
    assert [type(o).__name__ for o in out] == ["list", "RuntimeError", "list"]
    assert [out[0][0]["id"], out[2][0]["id"]] == ["a", "c"]
    assert out[0][0]["probs"] == answerer.answer([requests[0]])[0][0]["probs"]


# --- on Ray Serve -----------------------------------------------------------------------------


def _chunked(url: str, size: int) -> tuple[int, dict]:
    """POST a chunked body of ``size`` bytes (no Content-Length), in 1 MiB chunks."""
    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
    chunk = b" " * (1 << 20)
    try:
        conn.request("POST", "/predict", body=(chunk for _ in range(size >> 20)), encode_chunked=True,
                     headers={"content-type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    except (BrokenPipeError, ConnectionResetError):
        reply = conn.getresponse()                     # the server answered and closed before the end
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_bad_request_in_good_traffic_fails_alone(served):
    url, cfg = served
    bad = {**BAD, "chunked-over-8-mib": (None, 413, "over the limit of 8388608")}
    good = _body(QUESTION)
    for _ in range(5):
        with ThreadPoolExecutor(8) as pool:
            goods = [pool.submit(post_question, url, good) for _ in range(12)]
            bads = {name: pool.submit(_chunked, url, 9 << 20) if body is None else pool.submit(post_question, url, body)
                    for name, (body, _, _) in bad.items()}
            assert [f.result()[0] for f in goods] == [200] * 12
            for name, future in bads.items():
                status, reply = future.result()[:2]
                assert status == bad[name][1] and bad[name][2] in reply["error"], (name, reply)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chunked_bodies_far_over_the_limit_leave_no_memory_behind(served):
    """Serve's proxy refuses them after reading the limit, so neither it nor the ingress holds the
    rest (without the proxy's limit, each 64 MiB body left both 12 to 22 MiB larger)."""
    url, cfg = served
    titles = ("ray::ProxyActor", f"ray::ServeReplica:{cfg.app_name}:Ingress")

    def memory() -> dict[tuple[str, int], int]:           # each ingress replica and proxy on its own
        tree = process_tree(os.getpid())
        return {(title, pid): mib for title in titles for pid, mib in resident_mib(tree, title).items()}

    for _ in range(2):                              # what any first large request costs
        assert _chunked(url, 64 << 20)[0] == 413
    before = memory()
    replies = [_chunked(url, 64 << 20) for _ in range(10)]
    after = memory()
    assert all(status == 413 and "over the limit of 8388608" in reply["error"] for status, reply in replies), replies
    grown = {key: after[key] - before[key] for key in before.keys() & after.keys()}
    assert {title for title, _ in grown} == set(titles), (before, after)
    assert max(grown.values()) < 40, grown
    assert post_question(url, _body(QUESTION))[0] == 200


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_api_is_described_by_openapi(served):
    import urllib.request

    url, _ = served
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=60) as reply:
        doc = json.loads(reply.read())
    body = doc["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/QuestionIn"} in body["anyOf"]
    question = doc["components"]["schemas"]["QuestionIn"]
    assert set(question["required"]) == {"document", "query", "candidates"}
    assert {"400", "413", "422"} <= set(doc["paths"]["/predict"]["post"]["responses"])
    assert "XXXXX" in question["properties"]["query"]["description"] and "@placeholder" not in json.dumps(doc)
    examples = doc["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    for name, example in examples.items():
        status, answer, _ = post_question(url, json.dumps(example["value"]).encode())
        assert status == 200, (name, answer)
