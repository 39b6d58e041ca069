"""Test modules that need a package the GPU machines lack (MLflow, Ray, Optuna, and pydantic,
which comes with Ray Serve) skip, naming it, instead of failing to collect: ``pytest -m gpu``
there collects the whole suite without errors. Without CUDA, Triton's kernels run through its
interpreter (``TRITON_INTERPRET=1``, read as Triton is imported, so set before any test runs)."""

from __future__ import annotations

import pytest

OPTIONAL = ("mlflow", "ray", "optuna", "pydantic")


def _missing_optional(error: BaseException | None) -> str | None:
    """The optional package whose absence ``error`` reports, if that is what it is."""
    root = (getattr(error, "name", None) or "").split(".")[0] if isinstance(error, ModuleNotFoundError) else ""
    return root if root in OPTIONAL else None


class OptionalDepsModule(pytest.Module):
    def collect(self):
        try:
            self.obj                                              # imports the test module
        except pytest.Collector.CollectError as error:
            missing = _missing_optional(error.__cause__)
            if missing is None:
                raise
            pytest.skip(f"needs {missing}, which is not installed", allow_module_level=True)
        return super().collect()


def pytest_configure(config):
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is not None:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Keep the crash handler on after pytest's own is off: a fault while the process ends (a
    library's thread or finaliser) then prints every thread's stack, not a bare exit status."""
    import faulthandler
    import sys

    if sys.__stderr__ is not None and not sys.__stderr__.closed:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)


def pytest_pycollect_makemodule(module_path, parent):
    return OptionalDepsModule.from_parent(parent, path=module_path)


@pytest.fixture(autouse=True)
def _keeps_the_tracking_store():
    """A test that points the process's MLflow at its own store (``mlflow.set_tracking_uri`` sets
    ``MLFLOW_TRACKING_URI``) would send every later in-process test there: fail it instead."""
    import os

    before = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    yield
    after = {k: os.environ.get(k) for k in before}
    if after != before:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        pytest.fail(f"the test changed the process's MLflow store ({before} -> {after}); use MlflowClient(uri)")


@pytest.fixture(autouse=True)
def _fresh_iaa_logging():
    """Each test starts with ``iaa``'s loggers as a library leaves them (no handler, propagating to
    the root, where ``caplog`` listens), whatever an earlier in-process command installed."""
    import logging

    logger = logging.getLogger("iaa")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers[:], logger.level, logger.propagate = [], logging.NOTSET, True
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]



@pytest.fixture
def console():
    """``iaa``'s lines on stderr as the command line shows them, for in-process jobs whose output a test reads."""
    from iaa import logs

    logs.to_console()
