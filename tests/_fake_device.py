"""A stand-in accelerator on the CPU that counts device-to-host reads.

``on_fake_device(module)`` and ``batch_on_fake_device(batch)`` wrap a model's parameters and a
batch's tensors in :class:`DeviceTensor`: a tensor that reports the ``meta`` device (so every
``x.is_cpu`` test in the code takes the accelerator's branch: ``nn.GRU`` instead of the fused CPU
GRU, a dense embedding gradient, ``F.dropout``) while :class:`HostReads` computes each op on the
real CPU tensor inside. The batch's lengths stay plain host tensors, as on a GPU.

While :class:`HostReads` is active it records every op that would make a GPU wait for the
device on the host:

- a copy of a device tensor to the host (``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.numpy()``);
- a scalar read (``aten._local_scalar_dense``: ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``);
- an op whose output size depends on the data (``nonzero``, ``masked_select``, ``unique``,
  sparse ``coalesce``, ...), or that returns a Python value computed on the device (``equal``).

``torch.nn.utils.rnn``'s ``_pack_padded_sequence`` and ``_pad_packed_sequence`` return their
``batch_sizes`` / ``lengths`` on the host on every device; those outputs stay host tensors here.
"""

from __future__ import annotations

import traceback

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

aten = torch.ops.aten
DEVICE = torch.device("meta")
DATA_DEPENDENT = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
    aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default, aten.is_nonzero.default,
    aten.equal.default, aten._coalesce.default, aten.repeat_interleave.Tensor,
}
HOST_OUTPUTS = {aten._pack_padded_sequence.default: {1}, aten._pad_packed_sequence.default: {1}}


class DeviceTensor(torch.Tensor):
    """A CPU tensor that reports the accelerator's device; only :class:`HostReads` computes on it."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            device=DEVICE, requires_grad=inner.requires_grad, layout=inner.layout)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a DeviceTensor outside HostReads")


class HostReads(TorchDispatchMode):
    """Runs every op on the real tensors and records, in ``reads``, each device-to-host read
    (with the line of code that asked for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.paused = False
        self._functions = _HostCopies(self)

    def __enter__(self):
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._functions.__exit__(*exc)

    def record(self, what: str) -> None:
        if not self.paused:
            frames = [f for f in traceback.extract_stack()[:-2] if "/tests/_fake_device.py" not in f.filename]
            where = next((f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(frames)
                          if "/iaa/" in f.filename), "?")
            self.reads.append(f"{what} at {where}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_device = False

        def unwrap(x):
            nonlocal on_device
            if isinstance(x, DeviceTensor):
                on_device = True
                return x.inner
            if isinstance(x, torch.device) and x == DEVICE:
                on_device = True
                return torch.device("cpu")
            return x

        real_args, real_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        to_host = func is aten._to_copy.default and torch.device(kwargs.get("device") or DEVICE).type == "cpu"
        if on_device and (to_host or func in DATA_DEPENDENT):
            self.record(str(func.overloadpacket.__name__))
        out = func(*real_args, **real_kwargs)
        if not on_device or to_host:
            return out
        host = HOST_OUTPUTS.get(func, set())
        if isinstance(out, (tuple, list)):
            return type(out)(DeviceTensor(o) if isinstance(o, torch.Tensor) and i not in host else o
                             for i, o in enumerate(out))
        return DeviceTensor(out) if isinstance(out, torch.Tensor) else out


class _HostCopies(TorchFunctionMode):
    """``.tolist()`` and ``.numpy()`` read a tensor's memory without an op that a dispatch mode sees."""

    def __init__(self, mode: HostReads) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.tolist, torch.Tensor.numpy) and isinstance(args[0], DeviceTensor):
            self.mode.record(func.__name__)
            return func(args[0].inner, *args[1:], **kwargs)
        return func(*args, **kwargs)


def on_fake_device(module: nn.Module) -> nn.Module:
    """Move ``module``'s parameters to the fake device (call inside ``HostReads``)."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                setattr(sub, name, nn.Parameter(DeviceTensor(param.detach()), requires_grad=param.requires_grad))
    for sub in module.modules():
        if hasattr(sub, "kernels"):         # a reader chooses its kernels again after a move, as in ``.to``
            sub._apply(lambda t: t, recurse=False)
    return module


def batch_on_fake_device(batch):
    """The batch's tensors on the fake device; its lengths stay on the host (``Batch.to``'s rule)."""
    return batch.map_tensors(DeviceTensor)
