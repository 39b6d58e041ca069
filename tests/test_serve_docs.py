"""``iaa-cli serve``'s ingress in process, on its FastAPI app (class routes on an ``Ingress`` whose
reader is a ``Reader`` holding a tiny model): ``GET /docs`` works offline (the page loads only URLs
of the app itself, and each answers 200 with the asset, Swagger UI's script among them); the
OpenAPI document names the served model and shows its own answers; ``GET /`` says where the docs
are; every error, routing's included, is ``{"error", "status"}``."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from _faults import assert_says
from tests.test_serve import QUESTION, answerer, setup  # noqa: F401 - fixtures

ray_serve = pytest.importorskip("iaa.platform.ray_serve")
from iaa.jobs.inference import serve as job  # noqa: E402
from iaa.platform import serve_docs  # noqa: E402
from iaa.platform.serve_text import model_headers  # noqa: E402


def _call(method: str, path: str, body: bytes = b"", root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    """``METHOD path`` on the ingress's FastAPI app, through its ASGI interface."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": root_path, "query_string": b"", "headers": [],
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        asyncio.run(ray_serve.app(scope, receive, send))
    except Exception:  # noqa: BLE001 - Starlette raises the error again once its 500 is sent, for the server's log
        pass
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _get(path: str, root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    return _call("GET", path, root_path=root_path)


class _Handle:
    """A deployment handle in process: ``handle.METHOD.remote(*args)`` awaits the object's method."""

    def __init__(self, target: object) -> None:
        self.target = target

    def __getattr__(self, name: str) -> SimpleNamespace:
        async def remote(*args):
            result = getattr(self.target, name)(*args)
            return await result if inspect.isawaitable(result) else result

        return SimpleNamespace(remote=remote)


@pytest.fixture
def ingress(answerer, setup, monkeypatch):  # noqa: F811 - the fixtures imported above
    """The app's class routes bound to an ``Ingress`` (as Serve's replica binds them) whose reader
    is a ``Reader`` holding the tiny checkpoint (its batch: one request)."""
    from ray import serve

    reader = object.__new__(ray_serve.Reader.func_or_class)
    reader.answerer, reader.headers = answerer, model_headers(answerer.name, answerer.version)

    async def answer(questions):
        return answerer.answer([questions])[0]

    reader.answer = answer
    monkeypatch.setattr(ray_serve, "_grpc_on_node_address", lambda: None)
    user_class = ray_serve.Ingress.func_or_class.__bases__[0]          # the class under Serve's ASGI wrapper
    source = {"kind": "checkpoint", "ref": str(setup[2])}
    made = user_class(_Handle(reader), asdict(job.Limits()), job.CODE, source)
    monkeypatch.setattr(serve, "get_replica_context", lambda: SimpleNamespace(servable_object=made))
    return made


@pytest.mark.timeout(60)
def test_ready_says_503_at_once_while_no_reader_has_loaded_the_model(monkeypatch):
    """A starting server's readers are still loading the model: ``/ready`` answers 503 at once, as
    a readiness probe (with its timeout of a second or so) expects, rather than waiting the time
    that a busy reader is given; once a reader has answered, that longer wait applies."""
    from ray import serve

    class Loading:
        loaded = False

        async def describe(self, extra):
            if not self.loaded:
                await asyncio.sleep(3600)           # a replica still in its constructor
            return 200, json.dumps({"ready": True}), {}

    monkeypatch.setattr(ray_serve, "_grpc_on_node_address", lambda: None)
    reader = Loading()
    user_class = ray_serve.Ingress.func_or_class.__bases__[0]
    # the class's own module globals (Serve's wrapper holds a copy of them): without a shorter
    # first wait, the call would hang
    monkeypatch.setitem(user_class._describe.__globals__, "READY_WAIT_S", 3600.0)
    made = user_class(_Handle(reader), asdict(job.Limits()), job.CODE, {"kind": "checkpoint", "ref": "m.pt"})
    monkeypatch.setattr(serve, "get_replica_context", lambda: SimpleNamespace(servable_object=made))

    status, _, body = _get("/ready")
    assert status == 503 and json.loads(body)["ready"] is False
    assert_says(json.loads(body)["error"], "no reader replica has loaded the model yet")
    reader.loaded = True
    assert _get("/ready")[0] == 200 and made._wait_s() == 3600.0          # a busy reader is waited for now


def _urls(page: str) -> list[str]:
    return re.findall(r'(?:src|href|url:)\s*=?\s*"([^"]+)"', page)


def test_the_docs_page_loads_only_local_urls_and_each_answers():
    status, _, body = _get("/docs")
    page = body.decode()
    assert status == 200 and "SwaggerUIBundle" in page
    urls = _urls(page)
    assert "/docs/assets/swagger-ui-bundle.js" in urls and "/openapi.json" in urls
    assert not [u for u in urls if "//" in u or not u.startswith("/")], urls
    assert "cdn" not in page.lower() and "http" not in page.lower()
    for url in urls:
        if url == "/openapi.json":           # served by the ingress's class route (needs a replica)
            continue
        status, headers, asset = _get(url)
        assert status == 200 and asset == (serve_docs.asset_folder() / url.rsplit("/", 1)[1]).read_bytes(), url
        if url.endswith(".js"):
            assert headers["content-type"].startswith("text/javascript")
            assert b"SwaggerUIBundle" in asset


def test_the_bundled_swagger_ui_reads_the_openapi_version_the_app_writes():
    """Swagger UI 4 refuses an OpenAPI 3.1 document ("Unable to render this definition"), and
    FastAPI writes 3.1: the bundled script must be Swagger UI 5, which reads it."""
    spec = ray_serve.app.openapi()
    assert spec["openapi"].startswith("3.1")
    script = (serve_docs.asset_folder() / "swagger-ui-bundle.js").read_text(encoding="utf-8")
    assert re.search(r'"5\.\d+\.\d+"', script) and "isOAS31" in script


def test_the_docs_page_follows_the_apps_mount_point_and_refuses_other_files():
    _, _, body = _get("/docs", root_path="/reader")
    assert all(url.startswith("/reader/") for url in _urls(body.decode()))
    assert _get("/docs/assets/index.html")[0] == 404
    assert _get("/docs/assets/..%2Fpyproject.toml")[0] == 404


NOISE = ("Connecting to existing Serve app", "will not be applied", "graceful_shutdown", "killed by `ray.kill`",
         "Started Serve", "Deleting app")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_iaa_cli_serve_prints_only_its_own_lines_and_serves_docs_offline(tmp_path):
    """``iaa-cli serve`` from start to Ctrl-C: Serve's progress lines and Ray's failed-shutdown
    line stay out of the terminal, and ``/docs`` with its script comes from the server. Every port
    of it listens on loopback: Ray Serve asks for each replica's gRPC server (calls between
    deployments) on every interface, and on a local cluster it listens on loopback like the rest."""
    import json
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from tests._explain import tiny_setup
    from tests._processes import exposed_ports, listening, process_tree
    from tests.test_serve import QUESTION, post_question

    prepared, ckpts = tiny_setup(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "iaa.cli", "serve", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared),
           "--port", str(port), "--workdir", str(tmp_path / "w")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and not any("serving on" in line for line in lines):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
        assert any("serving on" in line for line in lines), "".join(lines)[-3000:]
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/docs", timeout=60).read().decode()
        assert "/docs/assets/swagger-ui-bundle.js" in page and "cdn" not in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/docs/assets/swagger-ui-bundle.js", timeout=60) as js:
            assert js.status == 200 and b"SwaggerUIBundle" in js.read()
        if shutil.which("ss") is not None and os.path.isdir("/proc"):     # ss (iproute2) lists the sockets
            assert post_question(f"http://127.0.0.1:{port}", json.dumps(QUESTION).encode())[0] == 200
            ports = listening(process_tree(proc.pid))
            assert len([row for row in ports if row[2].startswith("ray::ServeRepl")]) >= 2, ports   # ingress, reader
            assert not exposed_ports(ports), ports
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=180)
        lines.append(rest)
    output = "".join(lines)
    assert proc.returncode == 0, output[-3000:]
    assert not [n for n in NOISE if n in output], output[-3000:]


# --- the ingress in process ----------------------------------------------------------------------


def test_the_index_keeps_its_keys_and_says_where_the_docs_are(ingress, answerer):  # noqa: F811
    status, _, body = _get("/")
    index = json.loads(body)
    assert status == 200 and {"ready", "model", "load_seconds", "limits"} <= set(index)
    assert index["model"] == answerer.model and index["limits"] == asdict(job.Limits())
    assert index["docs"] == "http://127.0.0.1:8000/docs" and index["openapi"] == "http://127.0.0.1:8000/openapi.json"
    assert _get("/docs")[0] == 200 and json.loads(_get("/openapi.json")[2])["openapi"].startswith("3.1")


@pytest.mark.parametrize("method, path, status, phrase", [
    ("GET", "/nope", 404, "GET /nope: no such path"),
    ("GET", "/docs/assets/index.html", 404, "no such path"),
    ("GET", "/predict", 405, "GET /predict: method not allowed; /predict takes POST"),
    ("DELETE", "/", 405, "DELETE /: method not allowed"),
])
def test_routing_errors_take_the_apis_error_form(method, path, status, phrase):
    got, headers, body = _call(method, path)
    assert got == status and headers["content-type"] == "application/json"
    error = json.loads(body)
    assert set(error) == {"error", "status"} and error["status"] == status
    assert_says(error["error"], phrase)
    if status == 405:
        assert headers["allow"]                      # Starlette's header stays


def test_a_failure_of_the_ingress_itself_takes_the_apis_error_form(ingress, monkeypatch):
    async def broken():
        raise RuntimeError("a bug")

    monkeypatch.setattr(ingress, "_traits", broken)
    status, _, body = _call("POST", "/predict", json.dumps(QUESTION).encode())
    error = json.loads(body)
    assert status == 500 and set(error) == {"error", "status"} and error["status"] == 500
    assert_says(error["error"], "the server failed on this request (RuntimeError)")


def test_the_openapi_document_names_the_model_and_shows_its_answers(ingress, answerer):  # noqa: F811
    status, _, body = _get("/openapi.json")
    doc = json.loads(body)
    assert status == 200
    assert_says(doc["info"]["title"], f"checkpoint {answerer.name} (version {answerer.version})")
    assert_says(doc["info"]["description"], f"Serving checkpoint {answerer.name}")
    predict = doc["paths"]["/predict"]["post"]
    asked = predict["requestBody"]["content"]["application/json"]["examples"]
    shown = predict["responses"]["200"]["content"]["application/json"]["examples"]
    assert set(shown) == set(asked)
    for name, example in asked.items():                # each answer shown is the model's to that question
        got, _, answer = _call("POST", "/predict", json.dumps(example["value"]).encode())
        assert got == 200 and shown[name]["value"] == json.loads(answer), name
    one = shown["one question"]["value"]
    assert one["prediction"] in one["probs"] and one["correct"] == (one["prediction"] == "Gina")
    for path, example in (("/ready", _get("/ready")[2]), ("/", _get("/")[2])):
        ok = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        schema = doc["components"]["schemas"][ok["schema"]["$ref"].rsplit("/", 1)[1]]
        assert set(schema["properties"]) == set(json.loads(example)), path
        assert ok["example"] == json.loads(example), path
    assert_says(doc["info"]["description"], "an unknown path (404)", "(405)")
    assert "405" in predict["responses"]


def test_the_docs_page_takes_the_documents_title():
    _, _, body = _get("/docs")
    assert 'document.title = title' in body.decode() and 'specSelectors.info().get("title")' in body.decode()


@pytest.mark.parametrize("kind, ref, model, shown", [
    ("model", "models:/demo-reader/1", {"name": "demo-reader", "version": "1"}, "models:/demo-reader/1"),
    ("model", "models:/demo-reader@prod", {"name": "demo-reader", "version": "3"},
     "models:/demo-reader@prod (version 3)"),
    ("ensemble", "/srv/ensembles/cbt-ne-x3", {"name": "cbt-ne-x3", "version": "0a1b2c3d4e5f"},
     "ensemble cbt-ne-x3 (version 0a1b2c3d4e5f)"),
])
def test_the_served_model_is_named_by_its_uri_or_its_name(kind, ref, model, shown):
    assert serve_docs.served_name(kind, ref, model) == shown
