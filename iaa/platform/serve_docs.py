"""``GET /docs``: Swagger UI from the files of the ``fastapi-offline`` package (Swagger UI 5, which
reads the OpenAPI 3.1 documents FastAPI writes), served by the app itself, so that the page works
without internet access (FastAPI's own page loads its script and style sheet from a CDN).

:func:`add_docs` adds two routes to a FastAPI app made with ``docs_url=None``: the page, and
``GET /docs/assets/NAME`` for the few files it loads. Every URL on the page is on the app.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations in Serve's replicas.
import html
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import HTMLResponse, Response

ASSET_ROUTE = "/docs/assets"
ASSETS = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8",
          "swagger-ui.css": "text/css; charset=utf-8",
          "favicon.png": "image/png"}

_PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<link rel="stylesheet" type="text/css" href="{assets}/swagger-ui.css">
<link rel="icon" type="image/png" href="{assets}/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({{url: "{openapi}", dom_id: "#swagger-ui", layout: "BaseLayout", deepLinking: true,
                              presets: [SwaggerUIBundle.presets.apis]}});
</script>
</body>
</html>
"""


def asset_folder() -> Any:
    """The folder of Swagger UI's files inside the installed ``fastapi-offline`` package (an
    ``importlib.resources`` traversable)."""
    from importlib.resources import files

    return files("fastapi_offline") / "static"


def page(title: str, root_path: str, openapi_url: str) -> str:
    """The Swagger UI page; every URL it loads starts with ``root_path`` (where the app is mounted)."""
    root = root_path.rstrip("/")
    return _PAGE.format(title=html.escape(title), assets=root + ASSET_ROUTE, openapi=root + openapi_url)


def add_docs(app: FastAPI) -> None:
    """Add ``GET /docs`` and its assets to ``app`` (made with ``docs_url=None``)."""

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(page(app.title, request.scope.get("root_path", ""), app.openapi_url or "/openapi.json"))

    @app.get(ASSET_ROUTE + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        if name not in ASSETS:
            return Response(status_code=404)
        body = (asset_folder() / name).read_bytes()
        return Response(body, media_type=ASSETS[name], headers={"cache-control": "public, max-age=86400"})
