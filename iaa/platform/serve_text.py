"""Text that leaves a reader replica outside a JSON body: HTTP header values and log lines.

A model's name is a checkpoint's folder or file name, an ensemble folder's name or a registered
model's name, so it may be any Unicode text (``runs/模型-ü/...``, ``models:/модель/1``). HTTP
header values are bytes that servers encode as Latin-1 (Starlette does, and fails on anything
else), so :func:`model_headers` percent-encodes a name's UTF-8 bytes, as RFC 8187 encodes a
parameter's value: ``x-iaa-model: %E6%A8%A1%E5%9E%8B-%C3%BC``. Visible ASCII and spaces stay as
they are, except ``%`` itself (``%25``), so ``urllib.parse.unquote`` always gives the name back.
The JSON body's ``model.name`` holds the name itself. :func:`log_text` writes any text in ASCII,
so a log line never fails on a log file opened in another encoding.
"""

from __future__ import annotations

from urllib.parse import quote

# Left as they are: visible ASCII and the space, but not "%", which starts an encoded byte.
_AS_IS = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(text: str) -> str:
    """``text`` as an HTTP header value: ASCII, reversible with ``urllib.parse.unquote``."""
    return quote(text, safe=_AS_IS, errors="backslashreplace")


def model_headers(name: str, version: str) -> dict[str, str]:
    """The ``x-iaa-model`` and ``x-iaa-model-version`` headers of every reply."""
    return {"x-iaa-model": header_value(name), "x-iaa-model-version": header_value(version)}


def log_text(text: str) -> str:
    """``text`` in ASCII for a log line: other characters as ``\\u6a21`` escapes."""
    return text.encode("ascii", "backslashreplace").decode("ascii")
