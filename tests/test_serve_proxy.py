"""The body limit in Ray Serve's HTTP proxy (:mod:`iaa.platform.serve_proxy`), as ASGI: a body
over the limit is refused with the ingress's 413 having read at most the limit, and one within it
reaches the proxy's app as sent. (That Serve's proxy runs it, and what it saves, are slow tests
in ``tests/test_faults_serve.py``.)"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette", reason="needs ray[serve] (Starlette)")

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
    [middleware] = serve_proxy.middlewares()
    assert middleware.cls is serve_proxy.BodyLimit and middleware.kwargs == {"limit": 1234}
    monkeypatch.delenv(serve_proxy.LIMIT_ENV)
    assert serve_proxy.middlewares() == []
