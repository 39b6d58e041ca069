"""The one place that imports a private torch name: ``TorchDispatchMode``, the base of torch's own
``FlopCounterMode``, which the bench subclasses to count FLOPs by operand dtype (no public class
sees each matmul with its operands' dtype).

``tests/test_private_apis.py`` checks every name used here against the installed torch, so an
upgrade that moves one fails there, by name.
"""

from __future__ import annotations

NAMES = (("torch.utils._python_dispatch", "TorchDispatchMode"),)


def dispatch_mode() -> type:
    """torch's ``TorchDispatchMode``: a context whose ``__torch_dispatch__`` sees every aten call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode
