"""The one place that touches Ray's private modules: its switch for a single-machine cluster, by
which a local cluster binds every port to loopback (see :func:`iaa.platform.cluster.connect._loopback_only`).

``tests/test_private_apis.py`` checks every name used here against the installed Ray, so an
upgrade that moves one fails there, by name; at run time a missing name only loses the loopback
binding (Ray's default binding is used, as the caller says).
"""

from __future__ import annotations

from types import ModuleType

NAMES = (("ray._private.ray_constants", "ENABLE_RAY_CLUSTER"),)


def ray_constants() -> ModuleType | None:
    """Ray's constants module, whose ``ENABLE_RAY_CLUSTER`` a local start reads; None when it is gone."""
    try:
        from ray._private import ray_constants as constants
    except ImportError:
        return None
    return constants if hasattr(constants, "ENABLE_RAY_CLUSTER") else None
