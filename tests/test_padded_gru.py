"""``PaddedGRU`` (the CUDA encoder: two one-direction GRUs over padded rows, the backward one
over each row reversed within its own length) against ``nn.GRU(bidirectional=True)`` over
``pack_padded_sequence``.

On the CPU in float64, where the two differ only in the order of float sums: outputs at every
position, the final states, and the gradients of every parameter and of the input, within 1e-10.
A variant that reverses the whole padded row instead must fail that check. On CUDA (``gpu``
marker), whole readers with and without the kernel, forward and backward, in fp32.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from iaa.model import build_reader, nll_loss, preset
from iaa.model import kernels as fast
from iaa.model.kernels import padded_gru
from iaa.model.kernels.padded_gru import PaddedGRU
from iaa.jobs.train.bench import kernels_report
from tests import _bigru as bigru
from tests._bigru import TOL
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

# (lengths, L): unsorted, ties, length 1, full length, B from 1 to 7
RAGGED = [
    ([1], 1), ([4], 6), ([5, 5], 5), ([1, 9, 3], 9), ([13, 1, 7, 13], 13),
    ([2, 6, 6, 1, 4], 8), ([3, 11, 1, 8, 11, 5], 12), ([7, 1, 2, 7, 5, 3, 6], 7),
]


def _whole_row_reversal(x: torch.Tensor, lengths: torch.Tensor, gru: nn.GRU) -> torch.Tensor:
    """The mutant: the backward direction over the whole padded row flipped (padding first)."""
    weights = {f"{n}_l0": getattr(gru, f"{n}_l0_reverse") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    one_way = nn.GRU(gru.input_size, gru.hidden_size, batch_first=True).double()
    fw = PaddedGRU().encode(x, lengths, gru)[..., : gru.hidden_size]
    bw = torch.func.functional_call(one_way, weights, (x.flip(1),))[0].flip(1)
    real = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
    return torch.cat([fw, bw], -1).masked_fill(~real.unsqueeze(-1), 0.0)


def _padded(gru, x, lengths):
    return PaddedGRU().encode(x, lengths, gru)


@pytest.mark.parametrize("lengths, max_len", RAGGED)
def test_padded_gru_equals_the_packed_bidirectional_gru(lengths: list[int], max_len: int) -> None:
    bigru.assert_equals_packed(_padded, lengths, max_len)


def test_reversing_the_whole_padded_row_fails_the_check() -> None:
    """The check above can fail: reversing each row as a whole lets padding into the backward
    states, beyond the tolerance on a ragged batch (and not on a batch without padding)."""
    encoder = bigru.encoder()
    x = torch.randn(4, 9, 5, dtype=torch.float64)
    ragged, full = torch.tensor([9, 2, 5, 1]), torch.tensor([9, 9, 9, 9])
    for lengths, differs in ((ragged, True), (full, False)):
        want = bigru.states_final_grads(encoder, x, lengths, bigru.packed, seed=1)
        got = bigru.states_final_grads(encoder, x, lengths, lambda g, x_, n: _whole_row_reversal(x_, n, g), seed=1)
        gap = max((got[0] - want[0]).abs().max().item(), *((a - b).abs().max().item() for a, b in zip(got[2], want[2])))
        assert (gap > 1e-3) == differs, (lengths, gap)


def test_the_kernel_runs_the_modules_own_parameters() -> None:
    """Its parameters are the bidirectional module's: names and shapes, checkpoints load."""
    encoder, reference = bigru.encoder(seed=0), nn.GRU(5, 4, batch_first=True, bidirectional=True).double()
    state = encoder.gru.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in reference.state_dict().items()}
    other = bigru.encoder(seed=3)
    other.load_state_dict(encoder.state_dict())                   # a checkpoint of the reference
    x, lengths = torch.randn(3, 6, 5, dtype=torch.float64), torch.tensor([6, 2, 4])
    torch.testing.assert_close(_padded(other.gru, x, lengths), bigru.packed(encoder.gru, x, lengths), **TOL)
    before = [p for p in other.gru.parameters()]
    x.requires_grad_()
    _padded(other.gru, x, lengths).sum().backward()
    assert [p for p in other.gru.parameters()] == before          # the same objects, now with gradients
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in before)


def test_reversal_reverses_each_row_within_its_length() -> None:
    rev, real = padded_gru.reversal(torch.tensor([3, 1, 5]), 5)
    assert rev.tolist() == [[2, 1, 0, 3, 4], [0, 1, 2, 3, 4], [4, 3, 2, 1, 0]]
    assert real.sum(1).tolist() == [3, 1, 5]
    assert torch.equal(rev.gather(1, rev), torch.arange(5).expand(3, 5))   # its own inverse


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_select_chooses_it_on_cuda_up_to_h_128(precision: str, monkeypatch) -> None:
    """Chosen for h=128 and not for h=256, without touching CUDA; bench says why."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: pytest.fail("make touched CUDA"))
    paper = preset("paper", vocab_size=100)
    chosen = fast.select("cuda", precision, paper)
    assert isinstance(chosen.encoder, PaddedGRU) and chosen.encoder.bf16 == (precision == "bf16")
    assert kernels_report(chosen, paper)["encoder"] == "PaddedGRU"
    assert not chosen.describe()["amx_recurrence"]                          # what bench asks of it
    wide = dataclasses.replace(paper, hidden_dim=256)
    assert fast.select("cuda", precision, wide).encoder is None
    assert kernels_report(fast.select("cuda", precision, wide), wide)["encoder"] == \
        "reference (PaddedGRU covers h <= 128)"
    off = dataclasses.replace(paper, fused_gru=False)
    assert fast.select("cuda", precision, off).encoder is None
    assert kernels_report(fast.select("cuda", precision, off), off)["encoder"] == "reference (fused_gru is off)"
    assert not isinstance(fast.select("cpu", precision, paper).encoder, PaddedGRU)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_on_cuda_the_kernel_runs_the_gru_in_fp32_in_either_precision(precision: str, monkeypatch) -> None:
    """cuDNN's bf16 GRU over padded rows does not run as the persistent kernel (a bf16 step
    trained ~3x slower than an fp32 one on an H200): the kernel chosen for CUDA runs its GRU in
    the fp32 weights' dtype in both precisions, even where cuDNN has bf16 RNN kernels; on the
    CPU a bf16 reader's GRU stays bf16."""
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)   # bf16 RNN kernels (>= 9.13)
    kernel = fast.select("cuda", precision, preset("paper", vocab_size=100)).encoder
    assert isinstance(kernel, PaddedGRU)
    assert padded_gru.gru_dtype("cuda", kernel.bf16, torch.float32) == torch.float32
    on_cpu = torch.bfloat16 if precision == "bf16" else torch.float32
    assert padded_gru.gru_dtype("cpu", kernel.bf16, torch.float32) == on_cpu
    seen = []
    run = padded_gru._run
    monkeypatch.setattr(padded_gru, "_run", lambda module, weights, x: seen.append(x.dtype) or run(module, weights, x))
    gru = nn.GRU(6, 4, batch_first=True, bidirectional=True)
    kernel.encode(torch.randn(2, 5, 6), torch.tensor([5, 3]), gru)          # on the CPU
    assert seen == [on_cpu, on_cpu]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_cpu_reader_with_the_kernel_equals_the_reference(precision: str) -> None:
    """The whole reader (the query and the document encoders through the kernel), training."""
    cfg = preset("tiny", vocab_size=60, steps=3, dropout=0.0)
    batch = random_batch([20, 25, 9, 16], [5, 7, 3, 6], vocab=60, seed=4)
    results = []
    for encoder in (PaddedGRU(precision), None):
        torch.manual_seed(0)
        model = build_reader(cfg, "cpu", precision)
        model.kernels = fast.Kernels("cpu", precision, encoder=encoder)
        log_p = model(batch).log_probs
        nll_loss(log_p, batch.answer).backward()
        results.append((log_p.detach(), [p.grad for p in model.parameters()]))
    (lp, grads), (lp_ref, grads_ref) = results
    tol = dict(atol=1e-5, rtol=1e-4) if precision == "fp32" else dict(atol=2e-2, rtol=5e-2)
    torch.testing.assert_close(lp, lp_ref, **tol)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a.to_dense() if a.is_sparse else a, b.to_dense() if b.is_sparse else b, **tol)


@pytest.mark.gpu
def test_a_cuda_reader_with_the_kernel_equals_the_packed_reference() -> None:
    """On CUDA in fp32 (TF32 off): log-probabilities and every gradient of a reader with
    PaddedGRU against the same reader with ``nn.GRU`` over packed sequences."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU machine")
    bigru.assert_cuda_reader_equals_packed(PaddedGRU)


class _FakeStream:
    """Records the order of stream waits; stands in for ``torch.cuda.Stream`` on the CPU."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: "_FakeStream") -> None:
        self.log.append(f"{self.name} waits for {other.name}")


def test_the_two_stream_path_orders_its_streams_and_records_its_tensors(monkeypatch) -> None:
    """The CUDA path's stream logic, run on the CPU with stand-in streams: the same result as the
    sequential path; the side stream waits for the current one before its work, the current one
    for the side stream after; every tensor crossing streams is recorded on the other one."""
    log, recorded = [], []
    main = _FakeStream("main", log)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _FakeStream("side", log))

    class _On:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            log.append(f"work on {self.stream.name}")

        def __exit__(self, *exc):
            log.append(f"back from {self.stream.name}")

    monkeypatch.setattr(torch.cuda, "stream", _On)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: recorded.append((t, s.name)))
    encoder, kernel = bigru.encoder(), PaddedGRU()
    x, lengths = torch.randn(3, 7, 5, dtype=torch.float64), torch.tensor([7, 1, 4])
    rev, _ = padded_gru.reversal(lengths, 7)
    weights = [padded_gru._direction(encoder.gru, suffix, torch.float64) for suffix in ("", "_reverse")]
    fw, bw = kernel._two_streams(x, rev, kernel._modules(encoder.gru), weights)
    want = bigru.packed(encoder.gru, x, lengths)
    real = (torch.arange(7) < lengths.unsqueeze(1)).unsqueeze(-1)
    torch.testing.assert_close(torch.cat([fw, bw], -1).masked_fill(~real, 0.0), want, **TOL)
    assert log == ["side waits for main", "work on side", "back from side", "main waits for side"]
    on_side = {id(t) for t, s in recorded if s == "side"}
    assert {id(x), id(rev), *(id(w) for w in weights[1].values())} <= on_side
    assert id(bw) in {id(t) for t, s in recorded if s == "main"}
