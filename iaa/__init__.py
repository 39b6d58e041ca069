"""Iterative Alternating Attention reader and the platform that trains, tunes and ensembles it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("iaa")        # written once, in pyproject.toml
except PackageNotFoundError:            # the package as bare code (an MLflow model's code_paths), not installed
    __version__ = "0+unknown"
