"""Where the shared reference data lives: ``$IAA_SHARED_DATA``, by default ``../shared/data`` from the repo root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_data() -> Path:
    return Path(os.environ.get("IAA_SHARED_DATA", REPO.parent / "shared" / "data")).resolve()


def require_shared(relative: str) -> Path:
    """``shared_data() / relative``, or skip the test with a message saying what is missing."""
    path = shared_data() / relative
    if not path.exists():
        pytest.skip(f"shared data {path} is absent: set IAA_SHARED_DATA to the folder holding {relative}")
    return path
