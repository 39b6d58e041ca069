"""What Ray Serve's HTTP proxy answers itself (:mod:`iaa.platform.serve_proxy`), as ASGI: a body
over the limit is refused with the ingress's 413 having read at most the limit, and one within it
reaches the proxy's app as sent; the proxy's own plain 404, while no application is routed, is a
JSON 503 to retry. (That Serve's proxy runs it, and what it saves, are slow tests
in ``tests/test_faults_serve.py``.)"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette", reason="needs ray[serve] (Starlette)")

from _faults import assert_says  # noqa: E402
from iaa.platform import serve_proxy  # noqa: E402

LIMIT = 1000


class _Client:
    """A client's side of one ASGI request: ``body`` in ``chunk``-byte messages, counting the reads."""

    def __init__(self, body: bytes, chunk: int = 100) -> None:
        self.messages = [{"type": "http.request", "body": body[i:i + chunk], "more_body": i + chunk < len(body)}
                         for i in range(0, len(body), chunk)] or [{"type": "http.request", "body": b""}]
        self.read, self.sent = 0, []

    async def receive(self) -> dict:
        if self.read < len(self.messages):
            self.read += 1
            return self.messages[self.read - 1]
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def status(self) -> int:
        return self.sent[0]["status"]

    def reply(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


class _App:
    """The proxy's app: reads the whole body, then answers 200."""

    def __init__(self) -> None:
        self.received: list[dict] = []

    async def __call__(self, scope, receive, send) -> None:
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _scope(**headers: str) -> dict:
    return {"type": "http", "method": "POST", "path": "/predict",
            "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}


def _run(body: bytes, **headers: str) -> tuple[_Client, _App]:
    client, app = _Client(body), _App()
    asyncio.run(serve_proxy.BodyLimit(app, limit=LIMIT)(_scope(**headers), client.receive, client.send))
    return client, app


def test_a_declared_length_over_the_limit_is_refused_before_any_byte_is_read():
    client, app = _run(b"x" * 5000, content_length="5000")
    assert client.status() == 413 and client.read == 0 and app.received == []
    assert client.reply() == {"error": "request: 5000 bytes, over the limit of 1000", "status": 413}


def test_a_chunked_body_is_refused_as_soon_as_it_grows_past_the_limit():
    client, app = _run(b"x" * 100_000, transfer_encoding="chunked")
    assert client.status() == 413 and app.received == []
    assert client.read == LIMIT // 100 + 1                    # 1,100 bytes of 100,000 read
    assert client.reply() == {"error": "request: more than 1000 bytes, over the limit of 1000", "status": 413}


def test_a_chunked_body_claiming_a_small_length_is_still_counted():
    client, app = _run(b"x" * 100_000, transfer_encoding="chunked", content_length="10")
    assert client.status() == 413 and app.received == [] and client.read == LIMIT // 100 + 1


@pytest.mark.parametrize("size", [0, 999, LIMIT])
def test_a_chunked_body_within_the_limit_reaches_the_app_as_sent(size):
    client, app = _run(b"y" * size, transfer_encoding="chunked")
    assert client.status() == 200
    assert app.received == client.messages


def test_a_declared_length_within_the_limit_is_not_read_by_the_limit():
    client, app = _run(b"z" * 300, content_length="300")
    assert client.status() == 200 and app.received == client.messages


def test_the_proxy_takes_the_limit_from_its_environment(monkeypatch):
    for name, value in serve_proxy.proxy_env(1234).items():
        monkeypatch.setenv(name, value)
    module, _, function = serve_proxy.proxy_env(1)[serve_proxy.CALLBACK_ENV].rpartition(".")
    assert (module, function) == ("iaa.platform.serve_proxy", "middlewares")
    routes, limit = serve_proxy.middlewares()
    assert routes.cls is serve_proxy.NoRoute
    assert limit.cls is serve_proxy.BodyLimit and limit.kwargs == {"limit": 1234}
    monkeypatch.delenv(serve_proxy.LIMIT_ENV)
    assert [m.cls for m in serve_proxy.middlewares()] == [serve_proxy.NoRoute]


class _Answers:
    """The proxy's app: answers ``status`` with ``body`` as ``content_type``, in two body messages."""

    def __init__(self, status: int, body: bytes, content_type: bytes) -> None:
        self.status, self.body, self.content_type = status, body, content_type

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", self.content_type)]})
        await send({"type": "http.response.body", "body": self.body[:5], "more_body": True})
        await send({"type": "http.response.body", "body": self.body[5:]})


def _through_no_route(app: _Answers) -> _Client:
    client = _Client(b"")
    asyncio.run(serve_proxy.NoRoute(app)({"type": "http", "method": "GET", "path": "/ready", "headers": []},
                                         client.receive, client.send))
    return client


def test_the_proxys_own_404_while_no_application_is_routed_is_a_json_503_to_retry():
    client = _through_no_route(_Answers(404, b"Path '/ready' not found. Ping http://.../-/routes for available "
                                             b"routes.", b"text/plain; charset=utf-8"))
    assert client.status() == 503 and (b"retry-after", b"1") in client.sent[0]["headers"]
    reply = client.reply()
    assert reply["status"] == 503 and "Path" not in reply["error"]
    assert_says(reply["error"], "starting or stopping", "try again")


@pytest.mark.parametrize("status, body, content_type", [
    (404, b'{"error": "GET /nope: no such path", "status": 404}', b"application/json"),
    (200, b'{"ready": true}', b"application/json"),
    (200, b"<html>the docs</html>", b"text/html; charset=utf-8"),
    (503, b"Service Unavailable", b"text/plain"),
])
def test_every_other_answer_passes_the_no_route_middleware_as_it_is(status, body, content_type):
    client = _through_no_route(_Answers(status, body, content_type))
    assert client.status() == status and client.sent[0]["headers"] == [(b"content-type", content_type)]
    assert b"".join(m.get("body", b"") for m in client.sent[1:]) == body
