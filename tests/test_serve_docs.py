"""``iaa-cli serve``'s ``GET /docs`` works offline: the page loads only URLs of the app itself, and
each answers 200 with the asset (Swagger UI's script among them), in process, on the ingress's app."""

from __future__ import annotations

import asyncio
import re

import pytest

ray_serve = pytest.importorskip("iaa.platform.ray_serve")
from iaa.platform import serve_docs  # noqa: E402


def _get(path: str, root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    """``GET path`` on the ingress's FastAPI app, through its ASGI interface."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": root_path, "query_string": b"", "headers": [],
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(ray_serve.app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


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
    from tests.test_serve import QUESTION, _post

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
            assert _post(f"http://127.0.0.1:{port}", json.dumps(QUESTION).encode())[0] == 200
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
