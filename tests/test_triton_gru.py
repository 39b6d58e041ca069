"""``TritonGRU`` (the encoders' BiGRU as one persistent Triton kernel per pass) against
``nn.GRU(bidirectional=True)`` over ``pack_padded_sequence``.

On the CPU the kernels run through Triton's interpreter (``TRITON_INTERPRET=1``) in float64,
where kernel and reference differ only in the order of float sums: states, final states and the
gradients of every parameter and of the input, within 1e-10; a whole reader through the kernel
too. The kernels also compile here for an H100/H200 (sm_90), so a GPU call does not meet a
compile error first. On CUDA (``gpu`` marker): a reader with the kernel in fp32, and its replay
in a CUDA graph. Needs the ``triton`` extra (``pip install -e '.[triton]'``); skips without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("triton", reason="Triton is not installed: pip install -e '.[triton]' runs these tests "
                                     "(on the CPU through its interpreter)")

from iaa.model import build_reader, nll_loss, preset  # noqa: E402
from iaa.model import kernels as fast  # noqa: E402
from iaa.model.kernels.triton_gru import TritonGRU  # noqa: E402
from tests import _bigru as bigru  # noqa: E402
from tests._bigru import TOL  # noqa: E402
from tests._model_inputs import one_thread, random_batch  # noqa: E402,F401 (autouse fixture)

pytestmark = pytest.mark.timeout(300)
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA here, and Triton was not set to interpret (tests/conftest.py sets TRITON_INTERPRET=1)",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
# (lengths, L, h): unsorted, ties, length 1, full length; one block of rows and two (B > 16);
# h a power of 2 and not (its tiles padded)
RAGGED = [
    ([1], 1, 4), ([5, 5], 5, 16), ([1, 9, 3], 9, 12), ([13, 1, 7, 13], 13, 8),
    ([2, 6, 6, 1, 4], 8, 40), ([3, 11, 1, 8, 11, 5, 2, 9, 11, 4, 6, 1, 7, 10, 3, 8, 11, 2, 5], 11, 20),
]
CUDA_SKIP = "no CUDA device here (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU machine"


def _triton(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return TritonGRU().encode(x, lengths, gru)


@pytest.mark.parametrize("lengths, max_len, h", RAGGED)
def test_the_kernel_equals_the_packed_bidirectional_gru(lengths: list[int], max_len: int, h: int) -> None:
    bigru.assert_equals_packed(_triton, lengths, max_len, h=h)


def test_the_check_above_can_fail() -> None:
    """Told every row is full, the kernel lets padding into the backward states of the real
    positions of a ragged batch, beyond the tolerance (and not on a batch without padding)."""
    encoder = bigru.encoder(5, 8)
    x = torch.randn(4, 9, 5, dtype=torch.float64)
    for lengths, differs in ((torch.tensor([9, 2, 5, 1]), True), (torch.tensor([9, 9, 9, 9]), False)):
        real = (torch.arange(9) < lengths.unsqueeze(1)).unsqueeze(-1)
        told_full = _triton(encoder.gru, x, torch.full_like(lengths, 9)) * real
        gap = (told_full - bigru.packed(encoder.gru, x, lengths)).abs().max().item()
        assert (gap > 1e-3) == differs, (lengths, gap)


def test_inference_keeps_no_gates_and_gives_the_same_states() -> None:
    encoder = bigru.encoder(5, 12)
    x, lengths = torch.randn(4, 6, 5, dtype=torch.float64), torch.tensor([6, 1, 3, 6])
    with torch.no_grad():
        states = _triton(encoder.gru, x, lengths)
    assert states.grad_fn is None
    torch.testing.assert_close(states, bigru.packed(encoder.gru, x, lengths).detach(), **TOL)


def test_a_reader_through_the_kernel_equals_the_reference() -> None:
    """The whole reader (the query and the document encoders through the kernel), training, in
    fp32 on the CPU."""
    cfg = preset("tiny", vocab_size=60, steps=3, dropout=0.0)
    batch = random_batch([20, 25, 9, 16], [5, 7, 3, 6], vocab=60, seed=4)
    results = []
    for encoder in (TritonGRU(), None):
        torch.manual_seed(0)
        model = build_reader(cfg, "cpu", "fp32")
        model.kernels = fast.Kernels("cpu", "fp32", encoder=encoder)
        log_p = model(batch).log_probs
        nll_loss(log_p, batch.answer).backward()
        results.append((log_p.detach(), [p.grad for p in model.parameters()]))
    (lp, grads), (lp_ref, grads_ref) = results
    tol = dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(lp, lp_ref, **tol)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a.to_dense() if a.is_sparse else a, b.to_dense() if b.is_sparse else b, **tol)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_select_chooses_it_on_cuda_where_switched_on(precision: str) -> None:
    """Off by default (cuDNN's PaddedGRU runs); on, it is chosen on CUDA up to h = 256, without
    touching CUDA, and never on the CPU."""
    paper = preset("paper", vocab_size=100)
    assert type(fast.select("cuda", precision, paper).encoder).__name__ == "PaddedGRU"
    on = dataclasses.replace(paper, triton_gru=True)
    assert isinstance(fast.select("cuda", precision, on).encoder, TritonGRU)
    assert isinstance(fast.select("cuda", precision, dataclasses.replace(on, hidden_dim=256)).encoder, TritonGRU)
    assert fast.select("cuda", precision, dataclasses.replace(on, hidden_dim=257)).encoder is None
    assert not isinstance(fast.select("cpu", precision, on).encoder, TritonGRU)


_COMPILE = """
import json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from iaa.model.kernels import triton_recurrence as k
from iaa.model.kernels.triton_gru import _sizes

sizes = _sizes(int(sys.argv[1]))
warps = sizes.pop("num_warps")
constants = {name: value for name, value in sizes.items()}
pointers = {name: "*fp32" for name in ("gi", "w_hh", "b_hh", "out", "gates", "d_out", "d_gi", "d_gh")}
done = {}
for fn, extra in ((k.forward, {"save": True}), (k.backward, {})):
    args = fn.arg_names
    signature = {a: ("*i64" if a == "lengths" else pointers.get(a) or ("constexpr" if a in constants or a in extra else "i32"))
                 for a in args}
    kernel = compile(ASTSource(fn, signature, constexprs={**constants, **extra}),
                     target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    done[fn.__name__] = len(kernel.asm["cubin"])
print(json.dumps(done))
"""


@pytest.mark.parametrize("h", [128, 40])
def test_the_kernels_compile_for_sm_90(h: int) -> None:
    """Triton's compiler (through ptxas) builds both kernels for an H100/H200 on this machine:
    what the interpreter above does not check (types, layouts, the dot's shapes)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(h)], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**env, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(built) == {"forward", "backward"} and all(size > 0 for size in built.values())


@pytest.mark.gpu
def test_a_cuda_reader_with_the_kernel_equals_the_packed_reference() -> None:
    """On CUDA in fp32 (TF32 off): log-probabilities and every gradient of a reader with
    TritonGRU against the same reader with ``nn.GRU`` over packed sequences; then the encoder
    captured in a CUDA graph replays the eager states."""
    if not torch.cuda.is_available():
        pytest.skip(CUDA_SKIP)
    bigru.assert_cuda_reader_equals_packed(TritonGRU, triton_gru=True)
    torch.manual_seed(0)
    gru = nn.GRU(32, 32, batch_first=True, bidirectional=True).to("cuda")
    x = torch.randn(6, 40, 32, device="cuda")
    lengths = torch.tensor([40, 25, 9, 33, 1, 40], device="cuda")
    eager = TritonGRU().encode(x, lengths, gru)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = TritonGRU().encode(x, lengths, gru)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, atol=0, rtol=0)
