"""What Ray Serve's HTTP proxy answers itself: the request-body limit, and the seconds no
application is routed.

Serve's proxy reads a request's body as fast as the client sends it and queues all of it for the
replica, whatever the replica reads: a chunked body far over the ingress's limit crosses the
proxy and reaches the ingress whole, and both processes keep tens of MiB of it after the 413.
:class:`BodyLimit` stops such a body in the proxy, after reading at most the limit, with the
ingress's own 413 reply; the ingress (:mod:`iaa.platform.ray_serve`) still checks every body,
for proxies started without it.

In the first seconds of a start, before the application's route exists, and the last of a
stop, the proxy answers every path itself with a plain-text 404 (``Path '/ready' not found``).
:class:`NoRoute` answers those as the server's other errors are, JSON, and 503 with
``Retry-After``: a client that retries what may succeed later retries them, where it would give
up on a 404. The application's own 404 (JSON: an unknown path) passes as it is.

Serve calls :func:`middlewares` in each proxy when ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``
names it, with the limit in ``IAA_SERVE_MAX_REQUEST_BYTES`` (:func:`proxy_env` gives both; the
proxy reads them when it starts). This module imports no more than Starlette: it runs inside
Serve's proxy process.
"""

from __future__ import annotations

import json
import os
from typing import Any, Awaitable, Callable, MutableMapping

from starlette.middleware import Middleware

CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
LIMIT_ENV = "IAA_SERVE_MAX_REQUEST_BYTES"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def over_limit(limit: int, size: int | None = None) -> str:
    """What a 413 says of a body of ``size`` bytes (None: one that grew past the limit while read)."""
    amount = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return f"request: {amount}, over the limit of {limit}"


def proxy_env(limit: int) -> dict[str, str]:
    """The environment under which Serve's proxies refuse bodies over ``limit`` bytes."""
    return {CALLBACK_ENV: f"{__name__}.middlewares", LIMIT_ENV: str(limit)}


NO_ROUTE = "no application is routed here yet, or any more: the server is starting or stopping; try again shortly"
RETRY_AFTER_S = 1


def middlewares() -> list[Middleware]:
    """The proxy's middlewares: :class:`NoRoute`, and the body limit when ``IAA_SERVE_MAX_REQUEST_BYTES``
    sets one."""
    limit = os.environ.get(LIMIT_ENV, "")
    return [Middleware(NoRoute), *([Middleware(BodyLimit, limit=int(limit))] if limit.isdigit() else [])]


class NoRoute:
    """ASGI middleware: the proxy's own 404 (not JSON: no application is routed) becomes a JSON 503
    with ``Retry-After``; every other answer passes as it is."""

    def __init__(self, app: Callable[[Message, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        replaced = False

        async def sending(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message.get("status") == 404 and not _json(message):
                replaced = True
                await _answer(send, 503, NO_ROUTE, [(b"retry-after", str(RETRY_AFTER_S).encode())])
            elif not replaced:
                await send(message)                      # the proxy's own body is dropped with its start

        await self.app(scope, receive, sending)


def _json(start: Message) -> bool:
    """Whether an answer's start says its body is JSON (the application's answers all are)."""
    return any(name.lower() == b"content-type" and value.split(b";")[0].strip().lower() == b"application/json"
               for name, value in start.get("headers") or ())


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over ``limit`` bytes is answered 413 here.

    A declared ``Content-Length`` over the limit is refused before any of the body is read (the
    server holds a body to its declared length). A chunked body (whatever length it also claims)
    is read here up to the limit and refused as soon as it grows past it; one within the limit is
    handed on, message by message, as it came.
    """

    def __init__(self, app: Callable[[Message, Receive, Send], Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await _refuse(send, over_limit(self.limit, int(length)))
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)              # no body, or one the server holds to its length
            return
        read, size = [], 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break                                          # the client went away
            size += len(message.get("body", b""))
            if size > self.limit:
                await _refuse(send, over_limit(self.limit))
                return
            if not message.get("more_body", False):
                break
        replay = iter(read)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


async def _refuse(send: Send, error: str) -> None:
    await _answer(send, 413, error)


async def _answer(send: Send, status: int, error: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``{"error", "status"}``, as the ingress answers its errors."""
    body = json.dumps({"error": error, "status": status}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
