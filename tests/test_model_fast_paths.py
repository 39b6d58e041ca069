"""The kernels' parts held to their references on random inputs (forward outputs and gradients),
and the training step's own fast path; whole readers in ``tests/test_kernels.py``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from iaa.model import MODEL_KINDS, build_reader, nll_loss, preset
from iaa.model.kernels import gru_kernels
from iaa.model.kernels.deferred import Memory
from iaa.model.kernels.dropout import FastDropout
from iaa.model.kernels.fused_gru import fused_bigru
from iaa.jobs.training.step import build_optimizer, train_step
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

def _reference_bigru(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    return pad_packed_sequence(gru(packed)[0], batch_first=True, total_length=x.shape[1])[0]


@pytest.fixture(params=["python", "cpp"])
def recurrence(request):
    """The fused GRU's recurrence in Python (None) or in the C++ kernels (skipped if unbuildable)."""
    if request.param == "python":
        return None
    if gru_kernels.load() is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    return gru_kernels.load()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_bigru_equals_packed_nn_gru(dtype, recurrence):
    torch.manual_seed(0)
    gru = nn.GRU(6, 5, batch_first=True, bidirectional=True).to(dtype)
    with torch.no_grad():                                        # non-zero biases, larger weights
        for param in gru.parameters():
            param.normal_(0.0, 0.5)
    lengths = torch.tensor([4, 9, 1, 9, 6])                      # unsorted, ties, a length-1 row
    x = torch.randn(5, 11, 6, dtype=dtype, requires_grad=True)
    weight = torch.randn(5, 11, 10, dtype=dtype)
    results = []
    for fn in (lambda: _reference_bigru(gru, x, lengths), lambda: fused_bigru(x, lengths, gru._flat_weights, cpp=recurrence)):
        y = fn()
        grads = torch.autograd.grad((y * weight).sum(), [x, *gru.parameters()])
        results.append((y, grads))
    (y_ref, g_ref), (y_fast, g_fast) = results
    tol = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(y_fast, y_ref, **tol)
    assert torch.all(y_fast[torch.arange(11) >= lengths.unsqueeze(1)] == 0)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, **tol)


def test_fused_bigru_gradcheck(recurrence):
    torch.manual_seed(0)
    gru = nn.GRU(3, 2, batch_first=True, bidirectional=True).double()
    x = torch.randn(3, 5, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 2, 4])
    assert torch.autograd.gradcheck(lambda x, *w: fused_bigru(x, lengths, list(w), cpp=recurrence), (x, *gru._flat_weights))


def test_batched_memory_reads_equal_autograd():
    torch.manual_seed(0)
    memory = torch.randn(3, 7, 4, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    results = []
    for deferred in (False, True):
        reads = Memory(memory * 1.0, deferred=deferred)
        total, state = 0.0, keys[0]
        for key in keys:                                          # chained reads, as in the IAA loop
            weights = torch.softmax(reads.logits(state + key), -1)
            state = torch.tanh(reads.glimpse(weights))
            total = total + (state ** 2).sum() + weights[:, 0].sum()
        results.append((total, torch.autograd.grad(total, [memory, keys])))
    torch.testing.assert_close(results[1][0], results[0][0])
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b)


def test_fast_dropout_keeps_the_rate_and_the_expectation():
    torch.manual_seed(0)
    fast = FastDropout()
    drop = lambda x: fast(x, 0.2)  # noqa: E731
    x = torch.ones(400, 1000, requires_grad=True)
    y = drop(x)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(0.8, abs=0.002)
    assert y.mean().item() == pytest.approx(1.0, abs=0.005)        # scale = 1 / keep
    (y * 3).sum().backward()
    torch.testing.assert_close(x.grad, 3 * y.detach())              # same mask and scale
    lanes = kept.view(-1, 4).float().mean(0)                        # each 16-bit lane unbiased
    assert torch.all((lanes - 0.8).abs() < 0.005), lanes
    assert not torch.equal(drop(x) != 0, kept)                      # a new mask per call
    torch.manual_seed(1)
    first = drop(x)
    torch.manual_seed(1)
    assert torch.equal(drop(x), first)                              # torch.manual_seed fixes it
    odd = drop(torch.ones(7, 3, dtype=torch.float64))               # tail of < 4 elements, float64
    assert odd.dtype == torch.float64 and set(odd.unique().tolist()) <= {0.0, 65536 / (65536 - 13107)}
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40)).eval()          # eval: no dropout at all
    assert model.kernels.dropout is not None and model._drop(x) is x


def _reference_step(model, optimizer, batch, embed_l2, clip):
    """The straightforward step: L2 in the loss, dense gradients, clip_grad_norm_, plain Adam."""
    loss = nll_loss(model(batch).log_probs, batch.answer) + embed_l2 * model.embedding.weight.pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("clip", [5.0, 0.05])                       # 0.05: clipping active
def test_train_step_equals_reference_step(clip):
    batches = [random_batch([9, 14, 5], [4, 6, 3], seed=s) for s in range(4)]
    torch.manual_seed(0)
    fast = build_reader(preset("tiny", vocab_size=40, dropout=0.0, steps=3))
    ref = build_reader(preset("tiny", vocab_size=40, dropout=0.0, steps=3, sparse_embedding_grad=False))
    ref.load_state_dict(copy.deepcopy(fast.state_dict()))
    embed_l2 = 0.01
    fast_opt = build_optimizer(fast, lr=0.01, embed_l2=embed_l2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, foreach=False)
    for batch in batches:
        loss_fast = float(train_step(fast, fast_opt, batch, clip=clip))
        loss_ref = _reference_step(ref, ref_opt, batch, embed_l2, clip)
        assert loss_fast == pytest.approx(loss_ref, rel=1e-5)
    for (name, a), b in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4, msg=name)


def test_optimizer_state_round_trip(tmp_path):
    """Saved and loaded through a checkpoint file, the optimiser continues exactly: the learning
    rate, the step count and both Adam moments of every parameter come back."""
    from iaa.jobs.modeling import checkpoint

    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, dropout=0.0))
    optimizer = build_optimizer(model, lr=0.01, embed_l2=0.01)
    for seed in (0, 1):
        train_step(model, optimizer, random_batch([6, 9], [3, 4], seed=seed))
    optimizer.set_lr(0.008)
    path = checkpoint.save(tmp_path / "state.pt", {"model": model.state_dict(), "opt": optimizer.state_dict()})
    saved = checkpoint.torch.load(path, weights_only=True)
    again_model = build_reader(preset("tiny", vocab_size=40, dropout=0.0))
    again_model.load_state_dict(saved["model"])
    again = build_optimizer(again_model, lr=0.01, embed_l2=0.01)
    again.load_state_dict(saved["opt"])
    assert again.lr == pytest.approx(0.008)
    pairs = list(zip(model.parameters(), again_model.parameters()))
    for p, q in pairs:
        a, b = optimizer.adam.state[p], again.adam.state[q]
        assert set(a) == set(b) == {"step", "exp_avg", "exp_avg_sq"}
        for key in a:
            assert torch.equal(a[key], b[key]), key
    moved = [bool(optimizer.adam.state[p]["exp_avg_sq"].any()) for p, _ in pairs]
    assert sum(moved) > len(moved) // 2                             # the moments are not trivial
    batch = random_batch([6, 9], [3, 4], seed=2)
    clip = 1e-3                                                     # active: L2 weight decay 2λc
    assert train_step(model, optimizer, batch, clip=clip) == train_step(again_model, again, batch, clip=clip)
    for p, q in pairs:
        assert torch.equal(p, q)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_inference_table_equals_per_token_projection(kind):
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=2)
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, kind=kind)).eval()
    plain = build_reader(preset("tiny", vocab_size=40, kind=kind, inference_table=False)).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(batch).log_probs, plain(batch).log_probs, atol=1e-6, rtol=1e-5)
        for module in (model, plain):                     # a weight update must refresh the table
            module.embedding.weight.mul_(1.5)
            module.encoders.doc_encoder.gru.weight_ih_l0.add_(0.1)
        torch.testing.assert_close(model(batch).log_probs, plain(batch).log_probs, atol=1e-6, rtol=1e-5)


def test_cpp_recurrence_runs_the_two_directions_on_two_threads_with_the_same_result():
    cpp = gru_kernels.load()
    if cpp is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    torch.manual_seed(0)
    gru = nn.GRU(12, 16, batch_first=True, bidirectional=True)
    lengths = torch.tensor([30, 7, 22, 30, 1])
    x = torch.randn(5, 30, 12, requires_grad=True)
    weight = torch.randn(5, 30, 32)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = fused_bigru(x, lengths, gru._flat_weights, cpp=cpp)
            results.append((y, torch.autograd.grad((y * weight).sum(), [x, *gru.parameters()])))
        with torch.inference_mode():                              # the worker thread inherits it
            y_infer = fused_bigru(x, lengths, gru._flat_weights, cpp=cpp)
    finally:
        torch.set_num_threads(before)
    (y1, g1), (y2, g2) = results
    torch.testing.assert_close(y_infer, y1, atol=1e-6, rtol=1e-6)
    for a, b in zip((y2, *g2), (y1, *g1)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_cpp_recurrence_under_a_python_dispatch_mode_on_two_threads():
    """FlopCounterMode (``iaa-cli bench``) calls into Python on every op: no deadlock, all counted."""
    from torch.utils.flop_counter import FlopCounterMode

    cpp = gru_kernels.load()
    if cpp is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    torch.manual_seed(0)
    gru = nn.GRU(12, 16, batch_first=True, bidirectional=True)
    lengths = torch.tensor([9, 4, 9])
    x = torch.randn(3, 9, 12, requires_grad=True)
    before = torch.get_num_threads()
    counts = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            counter = FlopCounterMode(display=False)
            with counter:
                fused_bigru(x, lengths, gru._flat_weights, cpp=cpp).sum().backward()
            counts.append(counter.get_total_flops())
    finally:
        torch.set_num_threads(before)
    assert counts[0] > 0 and counts[0] == counts[1]


def test_the_cpp_build_is_keyed_by_source_flags_and_cpu(monkeypatch):
    """A cache folder shared by nodes with different CPUs must never serve one node's native
    build to another: the shipped build is generic, and a native build's name changes with the
    CPU's features."""
    assert gru_kernels.SOURCE.is_file() and "PYBIND11_MODULE" in gru_kernels.SOURCE.read_text()
    assert not set(gru_kernels.CFLAGS) & set(gru_kernels.NATIVE)
    native = (*gru_kernels.CFLAGS, "-march=native")
    names = {flags: gru_kernels.build_name(flags) for flags in (gru_kernels.CFLAGS, native, ("-O2",))}
    assert len(set(names.values())) == 3                              # one build per set of flags
    monkeypatch.setattr(gru_kernels, "cpu_features", lambda: "fpu sse sse2")
    assert gru_kernels.build_name(native) != names[native]            # another CPU: another build
    assert gru_kernels.build_name() == names[gru_kernels.CFLAGS]      # the generic build is shared


def _copy_of_the_kernels(folder):
    """``gru_kernels`` imported from a copy of its files in ``folder``."""
    import importlib.util
    import shutil

    for path in (Path(gru_kernels.__file__), gru_kernels.SOURCE, gru_kernels.AMX_SOURCE, *gru_kernels.HEADERS):
        shutil.copy2(path, folder / path.name)
    spec = importlib.util.spec_from_file_location(f"copied_gru_kernels_{folder.name}", folder / "gru_kernels.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def test_a_copy_of_the_source_in_another_folder_reuses_the_build(tmp_path, monkeypatch):
    """An MLflow model unpacks the package into a new folder on every load: the same source there
    must load the existing build, without compiling (``load`` of cpp_extension compiles)."""
    import torch.utils.cpp_extension

    if gru_kernels.load() is None:
        pytest.skip("the C++ kernels cannot be built here (no compiler or ninja)")
    copy = _copy_of_the_kernels(tmp_path)
    assert copy.SOURCE == tmp_path / "gru_kernels.cpp" and copy.build_name() == gru_kernels.build_name()

    def compile_again(*args, **kwargs):
        raise AssertionError(f"compiled again for a copy at {tmp_path}")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", compile_again)
    module = copy.build()
    assert module.__file__ == gru_kernels.build().__file__


@pytest.mark.slow                                # a build of the C++ kernels (unoptimised: seconds, not a minute)
@pytest.mark.timeout(1200)
def test_a_compiler_that_cannot_build_the_amx_code_still_builds_the_rest(tmp_path, monkeypatch):
    """``gru_amx.cpp`` is its own translation unit: where it does not compile (GCC before 11 knows
    no AMX), the rest is built without it, runs its other paths, and is loaded from then on
    without trying the AMX build again."""
    import torch.utils.cpp_extension

    if gru_kernels.load() is None:
        pytest.skip("the C++ kernels cannot be built here (no compiler or ninja)")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "builds"))
    (tmp_path / "src").mkdir()
    copy = _copy_of_the_kernels(tmp_path / "src")
    copy.AMX_SOURCE.write_text('#error "this compiler does not know AMX"\n')
    quick = ("-O0", "-fopenmp")                          # what is built does not matter here, only that it is
    with pytest.warns(UserWarning, match="AMX kernels do not compile"):
        built = copy.build_with_fallback(quick)
    assert not built.amx_paths(32)
    torch.manual_seed(0)
    gru = nn.GRU(6, 16, batch_first=True, bidirectional=True)
    x, lengths = torch.randn(3, 9, 6, requires_grad=True), torch.tensor([9, 4, 7])
    y = fused_bigru(x, lengths, gru._flat_weights, cpp=built)
    torch.testing.assert_close(y, fused_bigru(x, lengths, gru._flat_weights), atol=2e-6, rtol=1e-5)

    def compile_again(*args, **kwargs):
        raise AssertionError("tried the AMX build again")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", compile_again)
    assert copy.build_with_fallback(quick).__file__ == built.__file__
