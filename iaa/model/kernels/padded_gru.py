"""The encoders' BiGRU on CUDA as two one-direction GRUs over *padded* rows (eq. 1).

cuDNN runs a GRU over a ``PackedSequence`` with its standard algorithm: one GEMM and one
element-wise kernel per time step and direction. PyTorch picks the persistent algorithm
(``CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H``, one kernel for the whole sequence) only for an input
that is not packed, not double, with h <= 192 forward and h <= 128 backward (``get_algo`` and
``use_rnn_persist_small_h`` in ``aten/src/ATen/native/cudnn/RNN.cpp``). So here:

- the forward direction is a one-direction GRU over the padded rows (B, L, d);
- the backward direction is a second one-direction GRU over each row reversed *within its own
  length*, ``rev[b, t] = len_b - 1 - t if t < len_b else t`` (a gather on the device), and its
  outputs are read back through the same gather.

Padding comes after each row's real tokens in both directions, so it never reaches a real
state: the result equals ``nn.GRU(bidirectional=True)`` over ``pack_padded_sequence`` exactly,
up to the order of float sums. Padded positions of the output are set to exactly 0.

The parameters are those of the encoder's bidirectional ``nn.GRU`` (same objects, names and
shapes), passed to a one-direction ``nn.GRU`` per direction with ``torch.func.functional_call``;
gradients reach them through cuDNN's own backward. No host sync: the lengths stay on the device.

Cost per call, beyond the two cuDNN calls:

- fp32: none for the weights after the first call. cuDNN wants each direction's four tensors in
  one buffer of its layout; ``nn.GRU.flatten_parameters`` (run by ``functional_call`` when the
  one-direction module first sees them) moves each direction's four Parameters into such a
  buffer once (``set_`` under no_grad: same objects, same values). Anything that flattens the
  bidirectional module again (``.to()``, ``flatten_parameters()``) undoes that, and each call then
  copies the weights (one buffer, a few copy kernels) with cuDNN's "not part of single contiguous
  chunk" warning; results stay exact.
- bf16 on CUDA: none either, because the GRU runs in fp32 there, in both precisions (``gru_dtype``).
  cuDNN's bf16 GRU over padded rows does not run as the persistent kernel: it runs the recurrence
  step by step, several kernels per position of the document and the query, and trains a few
  times slower than the fp32 GRU, eager and captured alike (measured: benchmarks/HISTORY.md,
  "Measurements cited from the code"); and its weights, cast to bf16 at every call, were copied
  into a fresh cuDNN buffer each time (cuDNN's "not part of single contiguous chunk" warning).
  The rest of the reader still multiplies in bf16.
- bf16 on the CPU: the weights are cast at every call (4 casts per direction): the cast must stay
  in the autograd graph, and a cache keyed by the parameters' versions would save nothing in
  training, where each encoder runs once per step.
- the layout: the reversal index (a few (B, L) kernels), two gathers ((B, L, d) in, (B, L, h)
  out), a ``cat`` and a masked fill of (B, L, 2h); the recurrence also runs over the padding
  (B x L steps instead of the real tokens: small in length-bucketed batches).

A CUDA graph that captures this kernel must be captured after one eager call (the usual
warm-up): the first call moves the fp32 Parameters into their per-direction buffers.

On CUDA the two directions run on two streams (the backward direction on a side stream of this
kernel), so they overlap; autograd runs each backward node on its forward's stream. On the CPU
the same code runs sequentially (the exactness tests).

To measure on the card (``pytest -m gpu tests/test_padded_gru.py``, then the bench with
``fused_gru`` on and off): that the persistent algorithm is chosen (an nsys trace shows one RNN
kernel per direction and call, not one per step; the bench's kernel launches per step are about
equal in fp32 and bf16); that the two streams overlap; and the batch sizes at which the
persistent kernel loses to the standard one (it was slower at some sizes for LSTMs).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from iaa.model.kernels.support import Support

# cuDNN's persistent small-h algorithm covers h <= 192 forward and h <= 128 backward; above it
# the padded form would run the standard algorithm over padding, slower than the packed one.
MAX_HIDDEN = 128
_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def reversal(lengths: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's positions reversed within its length, and its real positions.

    Args:
        lengths: (B,) int64 on the device, each in [1, max_len].

    Returns:
        rev: (B, L) int64, ``len_b - 1 - t`` for t < len_b, else t (a permutation of each row,
            its own inverse).
        real: (B, L) bool, t < len_b.
    """
    steps = torch.arange(max_len, device=lengths.device)                   # (L,)
    real = steps < lengths.unsqueeze(1)                                    # (B, L)
    return torch.where(real, lengths.unsqueeze(1) - 1 - steps, steps), real


def gather_rows(x: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
    """x: (B, L, k), rev: (B, L) -> x[b, rev[b, t]]: (B, L, k)."""
    return x.gather(1, rev.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def gru_dtype(device: str, bf16: bool, weights: torch.dtype) -> torch.dtype:
    """The dtype the kernel's GRU runs in on ``device`` (a device type), for a reader in bf16 or
    not, with weights of dtype ``weights``: bf16 on the CPU in bf16, else the weights' own. On
    CUDA never bf16: cuDNN's bf16 GRU runs step by step (see the module docstring)."""
    return torch.bfloat16 if bf16 and device != "cuda" else weights


class PaddedGRU:
    """The encoders' BiGRU on CUDA (h <= 128): two one-direction cuDNN GRUs over padded rows.

    See the module docstring. The GRU runs in ``gru_dtype``: on CUDA in the weights' dtype (fp32)
    in either precision, its states fp32; on the CPU in bf16 under bf16 (its states too, as the
    reference's).
    """

    slot, switch = "encoder", "fused_gru"
    capturable = True     # no host sync: a CUDA graph may capture it (after one eager call)
    support = Support(devices=frozenset({"cuda"}))

    def __init__(self, precision: str = "fp32") -> None:
        self.bf16 = precision == "bf16"
        # per bidirectional GRU: one one-direction module per direction, on the meta device (it
        # holds no weights of its own). Each keeps seeing the same Parameters, so flattening
        # them into its cuDNN layout happens once.
        self._one_way: weakref.WeakKeyDictionary[nn.GRU, tuple[nn.GRU, nn.GRU]] = weakref.WeakKeyDictionary()
        self._side: dict[torch.device, torch.cuda.Stream] = {}

    @classmethod
    def make(cls, cfg, precision: str) -> "PaddedGRU | None":
        """The kernel for ``cfg`` (touches no device), or None where h > ``MAX_HIDDEN``."""
        return cls(precision) if cls.why_not(cfg) is None else None

    @staticmethod
    def why_not(cfg) -> str | None:
        """Why the kernel does not run ``cfg``'s encoders (None: it does)."""
        return None if cfg.hidden_dim <= MAX_HIDDEN else f"PaddedGRU covers h <= {MAX_HIDDEN}"

    def amx_recurrence(self, h: int) -> bool:
        """Whether the recurrent matmuls multiply on the CPU's AMX units: never (cuDNN's)."""
        return False

    def encode(self, x: torch.Tensor, lengths: torch.Tensor, gru: nn.GRU) -> torch.Tensor:
        """x: (B, L, d), lengths: (B,) int64 on x's device -> states (B, L, 2h), 0 at padding."""
        dtype = gru_dtype(x.device.type, self.bf16, gru.weight_ih_l0.dtype)
        rev, real = reversal(lengths, x.shape[1])                          # (B, L), (B, L)
        forward, backward = self._modules(gru)
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(dtype)
            weights = [_direction(gru, suffix, dtype) for suffix in ("", "_reverse")]
            if x.is_cuda:
                fw, bw = self._two_streams(x, rev, (forward, backward), weights)
            else:
                fw = _run(forward, weights[0], x)                          # (B, L, h)
                bw = gather_rows(_run(backward, weights[1], gather_rows(x, rev)), rev)
            states = torch.cat([fw, bw], -1)                               # (B, L, 2h)
        return states.masked_fill(~real.unsqueeze(-1), 0.0)

    def _two_streams(self, x, rev, modules, weights) -> tuple[torch.Tensor, torch.Tensor]:
        """Both directions, the backward one on the side stream: (B, L, h) each."""
        main = torch.cuda.current_stream(x.device)
        side = self._side.get(x.device)
        if side is None:
            side = self._side[x.device] = torch.cuda.Stream(x.device)
        side.wait_stream(main)                                             # x, rev, weights ready
        for tensor in (x, rev, *weights[1].values()):                      # made on main, read on side
            tensor.record_stream(side)
        with torch.cuda.stream(side):
            bw = gather_rows(_run(modules[1], weights[1], gather_rows(x, rev)), rev)
        fw = _run(modules[0], weights[0], x)
        main.wait_stream(side)
        for tensor in (bw, *weights[1].values()):                          # made on side (a first call's
            tensor.record_stream(main)                                     # flattening), read on main
        return fw, bw

    def _modules(self, gru: nn.GRU) -> tuple[nn.GRU, nn.GRU]:
        if gru not in self._one_way:
            self._one_way[gru] = tuple(
                nn.GRU(gru.input_size, gru.hidden_size, batch_first=True, device="meta") for _ in range(2))
        return self._one_way[gru]


def _direction(gru: nn.GRU, suffix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One direction's parameters under a one-direction GRU's names, in ``dtype``."""
    return {f"{name}_l0": getattr(gru, f"{name}_l0{suffix}").to(dtype) for name in _NAMES}


def _run(module: nn.GRU, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The one-direction GRU ``module`` with ``weights`` over padded rows x: (B, L, h)."""
    return torch.func.functional_call(module, weights, (x,))[0]
