"""``iaa-cli serve``: requests checked field by field, batches answered like ``iaa-cli predict``,
and (slow) the same on Ray Serve over HTTP, through bad requests and a killed replica."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.jobs.inference import serve as job
from tests._explain import tiny_setup
from tests._platform import start_local_ray

QUESTION = {"id": "q1", "document": "the cat sat on the mat . the dog ran to the mat .",
            "query": "the XXXXX ran to the mat", "candidates": ["cat", "dog", "mat"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    prepared, ckpts = tiny_setup(root)
    return root, prepared, ckpts["iaa"]


@pytest.fixture(scope="module")
def answerer(setup):
    root, prepared, ckpt = setup
    return job.Answerer.load(job.ModelSource("checkpoint", str(ckpt), str(prepared)))


def _body(value) -> bytes:
    return json.dumps(value).encode()


def _refused(answerer, body: bytes, limits: job.Limits = job.Limits()) -> job.RequestError:
    with pytest.raises(job.RequestError) as caught:
        answerer.parse(body, limits)
    return caught.value


@pytest.mark.parametrize("body, status, field", [
    (b'{"document": "a b', 400, "not valid JSON"),
    (b"[]", 400, "non-empty list"),
    (b'"just a string"', 400, "question object"),
    (_body({k: v for k, v in QUESTION.items() if k != "query"}), 400, "query: missing"),
    (_body({**QUESTION, "document": 7}), 400, "document: expected a string, got a number"),
    (_body({**QUESTION, "candidates": {"a": 1}}), 400, "candidates: expected a list of strings, got an object"),
    (_body([QUESTION, {**QUESTION, "candidates": ["cat", 3]}]), 400, "[2].candidates[2]: expected a string"),
    (_body([QUESTION, 5]), 400, "[2]: expected a JSON object"),
    (_body({**QUESTION, "id": True}), 400, "id: expected a string or an integer, got a boolean"),
    (_body({**QUESTION, "answer": ["cat"]}), 400, "answer: expected a string, got a list"),
    (_body({**QUESTION, "candidates": ["horse", "cow"]}), 422, "no candidate occurs in the document"),
    (_body([QUESTION, {**QUESTION, "query": "the cat ran"}]), 422, "[2]: the query has no XXXXX placeholder"),
    (_body({**QUESTION, "candidates": []}), 422, "the candidate list is empty"),
    (_body({**QUESTION, "candidates": ["cat", "dog", ""]}), 422, 'question: candidates[3]: an empty candidate ("")'),
    (_body([QUESTION, {**QUESTION, "candidates": ["  ", "dog"]}]), 422,
     '[2]: candidates[1]: an empty candidate ("  ")'),
    (_body({**QUESTION, "candidates": "cat||dog"}), 422, 'candidates[2] of the |-separated string: an empty candidate'),
    (_body({**QUESTION, "candidates": ["cat", "the dog"]}), 422,      # the phrase is in the document
     'candidates[2]: "the dog" is 2 words; candidates are single words'),
    (_body({**QUESTION, "candidates": ["cat", "dog cat"]}), 422,      # it is not
     'candidates[2]: "dog cat" is 2 words; candidates are single words'),
    (_body({**QUESTION, "candidates": "cat|the mat"}), 422,
     'candidates[2] of the |-separated string: "the mat" is 2 words'),
    (_body([{**QUESTION, "id": "a"}, QUESTION, {**QUESTION, "id": "a"}]), 422,   # as predict refuses them
     "[3].id: 'a' is also the id of [1]; give every question its own id"),
])
def test_bad_requests_get_a_status_naming_the_field(answerer, body, status, field):
    error = _refused(answerer, body)
    assert error.status == status and field in str(error)
    assert error.body() == {"error": str(error), "status": status}


def test_error_indices_count_from_one_as_the_ids_do(answerer):
    """The second question of a request gets id "2" when it has none; an error in it says [2]."""
    second = {k: v for k, v in QUESTION.items() if k != "id"}
    rows = answerer.answer([answerer.parse(_body([QUESTION, second]))[0]])[0]
    assert rows[1]["id"] == "2"
    error = _refused(answerer, _body([QUESTION, {**second, "candidates": ["cat", ""]}]))
    assert error.status == 422 and "[2]: candidates[2]" in str(error)


def test_a_null_id_and_answer_count_as_none(answerer):
    """Swagger UI fills in the schema's defaults: ``"id": null, "answer": null`` is a question without them."""
    [row] = answerer.answer([answerer.parse(_body({**QUESTION, "id": None, "answer": None}))[0]])[0]
    assert row["id"] == "1" and "correct" not in row


def _openapi(placeholder: str) -> dict:
    from iaa.platform import ray_serve, serve_docs

    return serve_docs.openapi_document(ray_serve.app, job.CODE.api(placeholder))


def _swagger_example(doc: dict) -> dict:
    """The body Swagger UI fills in from the schema alone: each property's example, else its default."""
    props = doc["components"]["schemas"]["QuestionIn"]["properties"]
    return {name: (p["examples"][0] if "examples" in p else p.get("default")) for name, p in props.items()}


def test_every_openapi_example_is_answered_as_shown(answerer):
    """Each request body /docs offers, posted exactly as the document gives it, is answered (200),
    and each answer is a documented 200 body; null id and answer count as none."""
    pytest.importorskip("iaa.platform.ray_serve")
    from pydantic import TypeAdapter

    doc = _openapi(answerer.placeholder)
    predict = doc["paths"]["/predict"]["post"]
    examples = [e["value"] for e in predict["requestBody"]["content"]["application/json"]["examples"].values()]
    examples += [_swagger_example(doc), {**QUESTION, "id": None, "answer": None}]
    assert predict["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"][0] == {
        "$ref": "#/components/schemas/AnswerOut"}
    answers = TypeAdapter(job.AnswerOut | list[job.AnswerOut])
    for body in examples:
        questions, single = answerer.parse(json.dumps(body).encode())          # raises where the server says 4xx
        rows = answerer.answer([questions])[0]
        answers.validate_python(rows[0] if single else rows)
        assert [r["id"] for r in rows] == [str(q.get("id") or i) for i, q in enumerate(
            [body] if single else body, 1)]


def test_the_openapi_placeholder_is_the_served_models():
    pytest.importorskip("iaa.platform.ray_serve")
    for placeholder, other in (("XXXXX", "@placeholder"), ("@placeholder", "XXXXX")):
        doc = _openapi(placeholder)
        text = json.dumps(doc)
        assert placeholder in doc["components"]["schemas"]["QuestionIn"]["properties"]["query"]["description"]
        assert other not in text and placeholder in _swagger_example(doc)["query"].split()


def test_any_unicode_model_name_travels_in_the_headers():
    from urllib.parse import unquote

    from starlette.responses import Response

    from iaa.platform.serve_text import log_text, model_headers

    for name in ("runs/模型-ü/best", "models:/модель/1", "50% off"):
        reply = Response("{}", media_type="application/json", headers=model_headers(name, "1"))
        sent = dict(reply.raw_headers)[b"x-iaa-model"]                 # the bytes an HTTP server writes
        assert sent.isascii() and unquote(sent.decode("ascii")) == name
        assert log_text(f"failed: {name}").isascii()
    assert model_headers("runs/模型-ü/best", "1")["x-iaa-model"] == "runs/%E6%A8%A1%E5%9E%8B-%C3%BC/best"
    assert model_headers("demo-reader", "3") == {"x-iaa-model": "demo-reader", "x-iaa-model-version": "3"}


def test_oversized_requests_get_413(answerer):
    limits = job.Limits(max_document_words=20, max_questions=2, max_request_bytes=2000)
    error = _refused(answerer, _body([QUESTION, {**QUESTION, "document": "the cat " * 20}]), limits)
    assert error.status == 413 and "[2].document: 40 words, over the limit of 20" in str(error)
    assert _refused(answerer, _body([QUESTION] * 3), limits).status == 413
    assert _refused(answerer, _body({**QUESTION, "id": "x" * 3000}), limits).status == 413
    assert len(answerer.parse(_body([QUESTION, {**QUESTION, "id": "q2"}]), job.Limits(max_document_words=14))[0]) == 2


def test_a_batch_of_requests_answers_each_like_predict(setup, answerer, tmp_path):
    root, prepared, ckpt = setup
    first = [QUESTION, {**QUESTION, "id": "q2", "query": "the XXXXX sat on the mat", "answer": "cat",
                        "candidates": ["cat", "bird", "dog", "fish"]}]
    second = {k: v for k, v in QUESTION.items() if k != "id"}
    requests = [answerer.parse(_body(first)), answerer.parse(_body(second))]
    assert [single for _, single in requests] == [False, True]
    rows = answerer.answer([questions for questions, _ in requests])

    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*first, second]), encoding="utf-8")
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(cli, ["predict", "--checkpoint", str(ckpt), "--data", str(prepared),
                                      "--input", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = [json.loads(line) for line in out.read_text().splitlines()]
    got = [row for rows_of_one in rows for row in rows_of_one]
    assert [len(r) for r in rows] == [2, 1] and len(got) == len(expected) == 3
    for g, e in zip(got, expected):
        assert g.pop("model") == {"name": ckpt.stem, "version": answerer.version}
        assert g.keys() == e.keys() and g["prediction"] == e["prediction"] and g.get("correct") == e.get("correct")
        assert g["probs"] == pytest.approx(e["probs"], abs=1e-6)
    assert [g["id"] for g in got] == ["q1", "q2", "1"]     # no id: its place in the request (predict: its line)
    assert [g["absent_candidates"] for g in got] == [[], ["bird", "fish"], []]
    assert got[1]["probs"]["bird"] == got[1]["probs"]["fish"] == 0.0


def test_the_version_of_a_checkpoint_is_its_content(setup, tmp_path):
    root, prepared, ckpt = setup
    found = job.locate(job.ModelSource("checkpoint", str(ckpt), str(prepared)))
    copy = tmp_path / "other.pt"
    copy.write_bytes(ckpt.read_bytes())
    again = job.locate(job.ModelSource("checkpoint", str(copy), str(prepared)))
    assert found.version == again.version and len(found.version) == 12 and found.name != again.name
    with pytest.raises(job.IaaError, match="MLflow model URI"):
        job.ModelSource("model", "demo-reader/1")


# --- on Ray Serve (one local Ray and one deployment of two replicas for all of these) -----------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_question(url: str, body: bytes) -> tuple[int, dict, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{url}/predict", data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), dict(err.headers)


SERVICE_WAIT_S = 600           # a busy 2-core laptop takes minutes to start Ray Serve's processes


def wait_ready(url: str, timeout_s: float = SERVICE_WAIT_S) -> None:
    """Wait until ``url/ready`` answers 200; fail naming the service that did not come up."""
    import time
    import urllib.error
    import urllib.request

    deadline, last = time.monotonic() + timeout_s, "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=30) as ready:
                if ready.status == 200:
                    return
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}: {err.read()[:200]!r}"
        except OSError as err:
            last = str(err)
        time.sleep(1)
    pytest.fail(f"the reader service at {url} was not ready within {timeout_s:g} s (last: {last})")


SERVED_NAME = "模型-ü-модель"      # the served copy's run folder: a name HTTP headers cannot carry as it is


@pytest.fixture(scope="module")
def served(setup):
    """The tiny checkpoint served from ``runs/模型-ü-модель/checkpoints/best.pt``."""
    pytest.importorskip("ray.serve", reason="needs ray[serve]")
    import ray

    from iaa.platform import ray_serve as platform_serve

    root, prepared, ckpt = setup
    copy = root / "runs" / SERVED_NAME / "checkpoints" / "best.pt"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(ckpt.read_bytes())
    started = not ray.is_initialized()          # another module's Ray may still be up: reuse it
    if started:                                 # with Serve's patience with a slow proxy, as the CLI's Ray
        start_local_ray(num_cpus=2)
    cfg = job.config(model_uri=None, checkpoint=copy, ensemble_dir=None, data_dir=prepared, workdir=root,
                     tracking_uri=None, replicas=2, max_batch=4, port=free_port(),
                     max_document_words=200)
    try:
        try:
            url = platform_serve.start(cfg, job.CODE)
        except Exception as err:  # noqa: BLE001 - name what did not start, then fail
            pytest.fail(f"Ray Serve did not start the reader service ({type(err).__name__}: "
                        f"{str(err).strip().splitlines()[-1][:300] if str(err).strip() else ''})")
        wait_ready(url)
        yield url, cfg
    finally:
        platform_serve.stop(cfg.app_name)
        if started:
            ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_served_answers_equal_predict_and_bad_requests_leave_the_replicas_up(setup, served, tmp_path):
    import urllib.request
    from urllib.parse import unquote

    from iaa.data.formats import cbt
    from iaa.platform import ray_serve as platform_serve

    root, prepared, ckpt = setup
    url, cfg = served
    with urllib.request.urlopen(f"{url}/ready", timeout=120) as ready:
        assert ready.status == 200 and json.loads(ready.read())["model"]["name"] == SERVED_NAME

    examples = cbt.read(root / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()[:12]
    records = [{"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
                "candidates": list(ex.candidates), "answer": ex.answer} for ex in examples]
    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(cli, ["predict", "--checkpoint", str(ckpt), "--data", str(prepared),
                                      "--input", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = [json.loads(line) for line in out.read_text().splitlines()]

    status, rows, headers = post_question(url, json.dumps(records[:8]).encode())           # a list
    singles = [post_question(url, json.dumps(r).encode()) for r in records[8:]]            # one object each
    assert status == 200 and all(s == 200 for s, _, _ in singles)
    version = headers["x-iaa-model-version"]
    assert headers["x-iaa-model"].isascii() and unquote(headers["x-iaa-model"]) == SERVED_NAME
    got = rows + [row for _, row, _ in singles]
    assert [g["id"] for g in got] == [e["id"] for e in expected]
    for g, e in zip(got, expected):
        assert g["model"] == {"name": SERVED_NAME, "version": version}
        assert g["prediction"] == e["prediction"] and g["correct"] == e["correct"]
        assert g["probs"] == pytest.approx(e["probs"], abs=1e-6)

    bad = [(b"{not json", 400, "not valid JSON"),
           (json.dumps({**records[0], "query": 3}).encode(), 400, "query: expected a string"),
           (json.dumps({**records[0], "document": "word " * 201}).encode(), 413, "201 words"),
           (json.dumps({**records[0], "candidates": ["zebra"], "answer": "zebra"}).encode(), 422, "no candidate occurs"),
           (json.dumps({**records[0], "candidates": [*records[0]["candidates"], " "]}).encode(), 422,
            "an empty candidate")]
    for body, code, message in bad:
        status, reply, _ = post_question(url, body)
        assert status == code and message in reply["error"], reply
    assert post_question(url, json.dumps(records[0]).encode())[0] == 200
    assert platform_serve.replicas(cfg.app_name) == {"RUNNING": 2}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_replica_loses_at_most_its_requests_in_flight_and_comes_back(setup, served):
    import time
    from concurrent.futures import ThreadPoolExecutor

    from iaa.platform import ray_serve as platform_serve

    url, cfg = served
    body = json.dumps(QUESTION).encode()
    concurrency, total = 4, 80
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(post_question, url, body) for _ in range(total)]
        while sum(f.done() for f in futures) < total // 4:
            time.sleep(0.05)
        killed = platform_serve.kill_replica(cfg.app_name)
        statuses = [f.result()[0] for f in futures]
    failed = sum(s != 200 for s in statuses)
    assert failed <= concurrency, statuses          # only requests in flight can be lost
    deadline = time.monotonic() + SERVICE_WAIT_S
    while not platform_serve.replaced(cfg.app_name, killed, 2) and time.monotonic() < deadline:
        time.sleep(1)
    assert platform_serve.replaced(cfg.app_name, killed, 2), \
        f"no new reader replica in place of {killed} within {SERVICE_WAIT_S} s: {platform_serve.replicas(cfg.app_name)}"
    assert post_question(url, body)[0] == 200


def test_the_cluster_serve_config_builds_a_deployment():
    pytest.importorskip("ray.serve", reason="needs ray[serve]")
    import yaml

    from iaa.platform import ray_serve as platform_serve

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "deploy" / "serve.yaml").read_text())
    module, _, builder = doc["applications"][0]["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), builder))     # what `serve deploy` imports
    args = platform_serve.config_args(doc["applications"][0]["args"])
    cfg = platform_serve.from_dict(args)
    assert cfg.source.kind == "model" and cfg.autoscale == (1, 8) and cfg.limits.max_document_words == 5000
    options = platform_serve.deployment_options(cfg)
    assert options["autoscaling_config"]["max_replicas"] == 8 and "num_replicas" not in options
    assert options["ray_actor_options"] == {"num_cpus": 2}
    assert platform_serve.from_dict(platform_serve.to_dict(cfg)) == cfg
    from ray.serve.schema import ServeDeploySchema

    from iaa.platform.serve_proxy import proxy_env

    ServeDeploySchema(**doc)
    assert doc["controller_options"]["runtime_env"]["env_vars"] == proxy_env(cfg.limits.max_request_bytes)


@pytest.mark.parametrize("kind", ["checkpoint", "ensemble"])
def test_a_model_no_replica_could_load_is_refused_before_a_cluster_starts(kind: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from _faults import assert_one_message
    from iaa.cli import cli

    if kind == "checkpoint":
        given = tmp_path / "junk.pt"
        given.write_bytes(b"not a checkpoint")
    else:
        given = tmp_path / "ensemble"
        given.mkdir()
    result = CliRunner().invoke(cli, ["serve", f"--{kind}", str(given), "--workdir", str(tmp_path / "w")])
    assert_one_message(result.exit_code, result.output, str(given))
    assert "Started a local Ray" not in result.output


def test_a_replicas_expected_error_is_said_without_its_class_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from iaa.platform import ray_serve

    message = "Traceback (most recent call last):\n  ...\niaa.errors.IaaError: /m/ensemble.json lists no members"
    status = SimpleNamespace(applications={"iaa": SimpleNamespace(deployments={"Reader": SimpleNamespace(
        message=message)})})
    monkeypatch.setattr(ray_serve.serve, "status", lambda: status)
    assert ray_serve.replica_failure("iaa") == "/m/ensemble.json lists no members"
