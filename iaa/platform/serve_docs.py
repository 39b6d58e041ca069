"""The served API's description: its OpenAPI document, and ``GET /docs``, Swagger UI from the files
of the ``fastapi-offline`` package (Swagger UI 5, which reads the OpenAPI 3.1 documents FastAPI
writes), served by the app itself, so that the page works without internet access (FastAPI's own
page loads its script and style sheet from a CDN).

:func:`openapi_document` describes the app for one served model: its title names the model, and
the 200 examples are the model's own answers. :func:`add_docs` adds two routes to a FastAPI app
made with ``docs_url=None``: the page, and ``GET /docs/assets/NAME`` for the few files it loads.
Every URL on the page is on the app.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations in Serve's replicas.
import copy
import html
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, Response

from iaa.jobs.ports import ServeApi

DOCS_URL = "/docs"
ASSET_ROUTE = DOCS_URL + "/assets"
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
                              presets: [SwaggerUIBundle.presets.apis], onComplete: function () {{
  var title = window.ui.specSelectors.info().get("title");     // the served model's, from the document
  if (title) {{ document.title = title; }}
}}}});
</script>
</body>
</html>
"""


class Ready(BaseModel):
    """``GET /ready``'s answer."""

    ready: bool = Field(description="true once a reader replica has loaded the model and answered a warm-up question")
    model: dict[str, str] = Field(description="the served model's name and version, as every answer carries them")
    load_seconds: float = Field(description="how long the reader took to fetch, load and warm up the model")


class Index(Ready):
    """``GET /``'s answer: ``/ready``'s, the limits of a request, and where the API is described."""

    limits: dict[str, int] = Field(description="the most a request may hold (over them: 413): words of a document "
                                               "and of a query, candidates per question, questions, bytes")
    docs: str = Field(description="the interactive API page (Swagger UI)")
    openapi: str = Field(description="the OpenAPI description of the API, for the served model")


def openapi_document(app: FastAPI, api: ServeApi, served: str | None = None, answers: dict[str, Any] | None = None,
                     ready: dict[str, Any] | None = None, index: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAPI document of the ingress's ``app`` for one served model: ``POST /predict``'s body
    is the serve job's request schema, with its examples (each answered by that model), and its 200
    answer the job's answer schema. ``served`` names the model in the title; ``answers`` (the
    model's answer to each named example), ``ready`` and ``index`` (``GET /ready``'s and ``GET /``'s
    answers) are the 200 examples of their routes."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    if served is not None:
        doc["info"]["title"] = f"{app.title}: {served}"
        doc["info"]["description"] = f"Serving {served}. {app.description}"
    doc["info"]["version"] = f"iaa {app.version}"        # the server's version, not the model's
    doc.setdefault("components", {}).setdefault("schemas", {}).update(copy.deepcopy(dict(api.definitions)))
    predict = doc["paths"]["/predict"]["post"]
    examples = {name: {"summary": name, "value": value} for name, value in api.examples.items()}
    predict["requestBody"] = {"required": True, "content": {"application/json": {
        "schema": copy.deepcopy(dict(api.request)), "examples": copy.deepcopy(examples)}}}
    answer: dict[str, Any] = {"schema": copy.deepcopy(dict(api.answer))}
    if answers:
        answer["examples"] = {name: {"summary": name, "value": copy.deepcopy(value)} for name, value in answers.items()}
    predict["responses"]["200"] = {"description": "the answer: one row per question (a list for a list)",
                                   "content": {"application/json": answer}}
    for path, example in (("/ready", ready), ("/", index)):
        if example is not None:
            doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["example"] = example
    return doc


def served_name(kind: str, ref: str, model: dict[str, str]) -> str:
    """The served model as a reader of the API knows it: its ``models:/`` URI, or the checkpoint's
    or ensemble's name (a path would show the server's file system), with the version its answers carry."""
    if kind == "model":
        return f"{ref} (version {model['version']})" if ref.rstrip("/").rsplit("/", 1)[-1] != model["version"] else ref
    return f"{kind} {model['name']} (version {model['version']})"


def asset_folder() -> Any:
    """The folder of Swagger UI's files inside the installed ``fastapi-offline`` package (an
    ``importlib.resources`` traversable)."""
    from importlib.resources import files

    return files("fastapi_offline") / "static"


def page(title: str, root_path: str, openapi_url: str) -> str:
    """The Swagger UI page; every URL it loads starts with ``root_path`` (where the app is mounted).
    Once the document is read, the page takes its title (which names the served model)."""
    root = root_path.rstrip("/")
    return _PAGE.format(title=html.escape(title), assets=root + ASSET_ROUTE, openapi=root + openapi_url)


def add_docs(app: FastAPI) -> None:
    """Add ``GET /docs`` and its assets to ``app`` (made with ``docs_url=None``); another name under
    ``/docs/assets/`` is the app's 404."""

    @app.get(DOCS_URL, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(page(app.title, request.scope.get("root_path", ""), app.openapi_url or "/openapi.json"))

    @app.get(ASSET_ROUTE + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404)
        body = (asset_folder() / name).read_bytes()
        return Response(body, media_type=ASSETS[name], headers={"cache-control": "public, max-age=86400"})
