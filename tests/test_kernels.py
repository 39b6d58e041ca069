"""Every kernel available on this machine, held to the reference reader (``iaa.model`` with no
kernels), for every variant of the reader, in training (outputs and every parameter's gradient)
and in inference, in fp32 and bf16.

A kernel runs alone in an otherwise reference reader with the same weights; ``select`` runs all
the kernels it chooses together. A variant a kernel does not declare must fall back: ``select``
never chooses the kernel for it.

Bounds:

- fp32: the same function in another order of float sums: log-probabilities within 2e-5 (they
  are near -2), gradients within 1e-5 absolute / 1e-4 relative.
- bf16: bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%), and a pass chains a few
  dozen rounded products: log-probabilities within 0.01 of the fp32 reference (~1% in
  probability), each parameter's gradient within 5% of it in norm (of 1e-3, for gradients
  smaller than that: ACT's halting unit gets ~1e-5 here, below bf16's resolution of the sums).

Sizes: "simd" has every size a multiple of 32, so the C++ kernels take their AVX-512 paths (and
AMX under bf16) where the CPU has them; "generic" has sizes that no vector path takes. The
weights are scaled up so that attention is far from uniform, and ACT's halting unit is set so
that examples stop at different steps.

Dropout: the "dropout" and "select" cases train with dropout 0.2, so ``FastDropout`` draws a
mask at each of the reader's drops; the reference reader applies the very masks it drew (a spy
on ``dropout_mask``) with plain autograd, so the two readers compute the same function and a
FastDropout that is bypassed, or that masks or scales wrongly forward or backward, fails.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from iaa.model import ReaderConfig, build_reader, nll_loss, preset
from iaa.model import kernels as fast
from iaa.model.kernels import dropout as dropout_kernel
from iaa.model.kernels import gru_kernels, support
from iaa.model.kernels.deferred import DeferredReads
from iaa.model.kernels.dropout import FastDropout
from iaa.model.kernels.encoder_table import EncoderTable
from iaa.model.kernels.fused_gru import FusedEncoder
from iaa.model.kernels.inference_steps import FusedSteps
from iaa.model.kernels.precision import SmallMatmuls
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(300)

VARIANTS = {
    "iaa": {},
    "iaa-fixed-query": {"kind": "iaa-fixed-query"},
    "as-reader": {"kind": "as-reader"},
    "act": {"halting": "act"},
    "candidate-softmax": {"candidate_softmax": True},
}
SIZES = {
    "simd": dict(embed_dim=32, hidden_dim=32, state_dim=32, gate_dim=32),
    "generic": dict(embed_dim=12, hidden_dim=8, state_dim=12, gate_dim=10),
}
DROPOUT = 0.2                   # the dropout and select cases: FastDropout draws masks in training
FP32 = dict(log_p=2e-5, atol=1e-5, rtol=1e-4)
BF16 = dict(log_p=0.01, grad=0.05)


def _cpp():
    return gru_kernels.load()


def _steps(cfg: ReaderConfig, precision: str, bf16_products: bool = True) -> FusedSteps | None:
    steps = FusedSteps.make(cfg, precision)                      # None without AVX-512 or for these sizes
    if steps is not None:
        steps.bf16_products = bf16_products
    return steps


# name: (kernel class, its instance for (cfg, precision), None where it cannot run here)
KERNELS = {
    "encoder-python": (FusedEncoder, lambda c, p: FusedEncoder(p, None)),
    "encoder-cpp": (FusedEncoder, lambda c, p: _cpp() and FusedEncoder(p, _cpp())),
    "table-python": (EncoderTable, lambda c, p: EncoderTable(p, None)),
    "table-cpp": (EncoderTable, lambda c, p: _cpp() and EncoderTable(p, _cpp())),
    "reads": (DeferredReads, lambda c, p: DeferredReads(p)),
    "layers": (SmallMatmuls, lambda c, p: SmallMatmuls(_cpp())),
    "layers-fp32-products": (SmallMatmuls, lambda c, p: SmallMatmuls(_cpp(), bf16_products=False)),
    "steps": (FusedSteps, lambda c, p: _steps(c, p)),
    "steps-fp32-products": (FusedSteps, lambda c, p: _steps(c, p, bf16_products=False)),
    "dropout": (FastDropout, lambda c, p: FastDropout()),
}


def _config(variant: str, size: str, dropout: float = 0.0) -> ReaderConfig:
    return preset("tiny", vocab_size=60, steps=3, dropout=dropout, **SIZES[size], **VARIANTS[variant])


class _SharedMasks:
    """A spy on ``FastDropout``'s masks (``dropout_mask``) and, as the reference reader's dropout
    slot, the same masks again in the same order, applied with plain autograd: x * keep * scale."""

    def __init__(self, monkeypatch) -> None:
        self.drawn: list[tuple[torch.Tensor, float]] = []
        self.replayed = 0
        draw = dropout_kernel.dropout_mask

        def spy(shape, p, device):
            keep, scale = draw(shape, p, device)
            self.drawn.append((keep, scale))
            return keep, scale

        monkeypatch.setattr(dropout_kernel, "dropout_mask", spy)

    def __call__(self, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, scale = self.drawn[self.replayed]
        self.replayed += 1
        return x * keep.to(x.dtype) * scale

    def check(self) -> None:
        """FastDropout drew a mask at every drop of the training pass, the reference applied each
        one, and the masks keep 1 - p of the elements, scaled by 1 / (the quantised keep)."""
        assert self.drawn and self.replayed == len(self.drawn)
        kept = sum(int(keep.sum()) for keep, _ in self.drawn) / sum(keep.numel() for keep, _ in self.drawn)
        assert abs(kept - (1 - DROPOUT)) < 0.05
        assert {scale for _, scale in self.drawn} == {65536 / (65536 - round(DROPOUT * 65536))}


def _reader(cfg: ReaderConfig, precision: str, kernels: fast.Kernels):
    """A reader with ``kernels``, its weights scaled up (attention far from uniform) and, under
    ACT, halting weights that make examples stop at different steps; the same for a seed."""
    torch.manual_seed(0)
    model = build_reader(cfg, "cpu", precision)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(2.0)
        if cfg.halting == "act":
            model.halting_unit.proj.weight.normal_(0.0, 1.0)
            model.halting_unit.bias.fill_(0.0)
    model.kernels = kernels
    return model


def _run(model, batch):
    """Training: log P and every parameter's gradient; inference: log P (eval, no gradient)."""
    model.train()
    log_p = model(batch).log_probs
    nll_loss(log_p, batch.answer).backward()
    grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad) for n, p in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        inferred = model(batch).log_probs
    return log_p.detach(), grads, inferred


def _finite_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(b)
    assert torch.equal(finite, torch.isfinite(a))                     # the same absent candidates
    return finite


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> float:
    return ((a - b).norm() / b.norm().clamp_min(floor)).item()


def _hold_to_reference(model, reference, batch, precision: str) -> None:
    got, want = _run(model, batch), _run(reference, batch)
    (lp, grads, inferred), (lp_ref, grads_ref, inferred_ref) = got, want
    for a, b in ((lp, lp_ref), (inferred, inferred_ref)):
        finite = _finite_equal(a, b)
        bound = FP32["log_p"] if precision == "fp32" else BF16["log_p"]
        assert (a - b)[finite].abs().max().item() < bound
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads_ref.items():
        if precision == "fp32":
            torch.testing.assert_close(grads[name], grad, atol=FP32["atol"], rtol=FP32["rtol"], msg=name)
        else:
            assert _rel(grads[name], grad, floor=1e-3) < BF16["grad"], name


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", [*sorted(KERNELS), "select"])
def test_kernel_equals_the_reference(name: str, variant: str, precision: str, size: str, monkeypatch) -> None:
    """The kernel (or all that ``select`` chooses) against the fp32 reference reader; a kernel
    that does not declare the variant, device or precision must not be chosen for it. With
    ``FastDropout`` in the reader, both train with dropout and the same masks."""
    dropping = name in ("dropout", "select")
    cfg = _config(variant, size, DROPOUT if dropping else 0.0)
    batch = random_batch([20, 25, 9, 16], [5, 7, 3, 6], vocab=60, seed=4)
    if name == "select":
        kernels = fast.select("cpu", precision, cfg)
    else:
        kind, make = KERNELS[name]
        if not kind.support.covers(cfg, "cpu", precision):
            assert not isinstance(getattr(fast.select("cpu", precision, cfg), kind.slot), kind)
            return
        kernel = make(cfg, precision)
        if not kernel:
            pytest.skip(f"{name} cannot run here (no C++ kernels, or sizes/instructions it lacks)")
        kernels = fast.Kernels("cpu", precision, **{kind.slot: kernel})
    masks = _SharedMasks(monkeypatch) if dropping else None
    assert isinstance(kernels.dropout, FastDropout) == dropping
    model = _reader(cfg, precision, kernels)
    # FastDropout alone changes no arithmetic: it is held to the reference in its own precision,
    # within fp32's bounds (under bf16, the reference with dropout is itself ~5% off fp32's gradients)
    alone = name == "dropout"
    reference_precision = precision if alone else "fp32"
    reference = _reader(cfg, reference_precision, fast.Kernels("cpu", reference_precision, dropout=masks))
    _hold_to_reference(model, reference, batch, "fp32" if alone else precision)
    if masks is not None:
        masks.check()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_reference_in_bf16_stays_within_bf16_bounds_of_fp32(precision: str) -> None:
    """The reference itself under bf16 (autocast): the bound every kernel is held to."""
    cfg = _config("iaa", "simd")
    batch = random_batch([20, 25, 9, 16], [5, 7, 3, 6], vocab=60, seed=4)
    model = _reader(cfg, precision, fast.Kernels("cpu", precision))
    reference = _reader(cfg, "fp32", fast.Kernels("cpu", "fp32"))
    _hold_to_reference(model, reference, batch, precision)
    if precision == "bf16":
        assert not torch.equal(_run(model, batch)[0], _run(reference, batch)[0])   # bf16 really ran


def test_a_new_variant_runs_the_reference() -> None:
    """A model kind, or an equation field, that no kernel declares: every slot runs the reference."""
    fields = {f.name: getattr(_config("iaa", "simd"), f.name) for f in dataclasses.fields(ReaderConfig)}
    for precision in ("fp32", "bf16"):
        assert fast.select("cpu", precision, SimpleNamespace(**fields)).chosen()        # the paper's: kernels
        new_kind = SimpleNamespace(**{**fields, "kind": "gated-attention"})
        assert fast.select("cpu", precision, new_kind).chosen() == {}


def test_a_new_equation_field_runs_the_reference(monkeypatch) -> None:
    fields = {f.name: getattr(_config("iaa", "simd"), f.name) for f in dataclasses.fields(ReaderConfig)}
    monkeypatch.setattr(support, "EQUATIONS", (*support.EQUATIONS, "attention_sum"))
    assert fast.select("cpu", "fp32", SimpleNamespace(**fields, attention_sum="max")).chosen() == {}


# Fields of ReaderConfig that do not change the equations a kernel computes: the sizes (each
# kernel checks those it needs in ``make``), what acts in training only (dropout: the reference
# and the kernel draw their masks differently, see ``test_model_fast_paths``), initialisation,
# the loss, and the implementation switches. A new field must be added here or to
# ``support.EQUATIONS``.
NOT_EQUATIONS = {"vocab_size", "embed_dim", "hidden_dim", "state_dim", "steps", "gate_dim", "dropout",
                 "ponder_cost", "halt_bias_init", "fused_gru", "triton_gru", "fast_dropout", "sparse_embedding_grad",
                 "batched_read_grad", "inference_table"}


def test_every_config_field_is_an_equation_or_declared_not_one() -> None:
    names = {f.name for f in dataclasses.fields(ReaderConfig)}
    assert names - NOT_EQUATIONS == set(support.EQUATIONS)
    assert not NOT_EQUATIONS & set(support.EQUATIONS)
    for kernel in fast.KERNELS:                                   # every kernel names every field
        assert set(kernel.support.equations) == set(support.EQUATIONS), kernel.__name__
        assert kernel.switch is None or kernel.switch in names


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_select_chooses_by_switch_device_and_variant(precision: str) -> None:
    cfg = _config("iaa", "simd")
    chosen = fast.select("cpu", precision, cfg).chosen()
    assert {"encoder", "table", "reads", "dropout"} <= set(chosen)
    assert ("layers" in chosen) == (precision == "bf16")
    off = dataclasses.replace(cfg, fused_gru=False, inference_table=False, batched_read_grad=False, fast_dropout=False)
    assert set(fast.select("cpu", precision, off).chosen()) <= {"layers", "steps"}
    assert set(fast.select("cuda", precision, cfg).chosen()) == {"encoder", "reads"}     # PaddedGRU
    assert set(fast.select("cuda", precision, off).chosen()) == set()
    assert "steps" not in fast.select("cpu", precision, _config("act", "simd")).chosen()
    with pytest.raises(ValueError, match="precision"):
        fast.select("cpu", "fp16", cfg)


def test_a_reader_moved_to_another_device_chooses_its_kernels_again() -> None:
    model = build_reader(_config("iaa", "generic"))
    assert model.kernels.device == "cpu" and model.kernels.encoder is not None
    model.to("meta")
    assert model.kernels.device == "meta" and model.kernels.chosen() == {}
    assert model.slots == fast.Slots()                                          # bound again: the reference


def test_a_deep_copy_of_a_reader_has_its_own_weights_and_kernels_sharing_the_compiled_code() -> None:
    """``copy.deepcopy`` (what ``AveragedModel`` and EMA make) of a reader whose kernels hold the
    compiled C++ module: the copy computes the same, its weights are its own, and the compiled
    module is shared, not copied (a module cannot be)."""
    import copy

    from torch.optim.swa_utils import AveragedModel

    model = build_reader(_config("iaa", "simd")).eval()
    assert model.kernels.encoder is not None and model.kernels.encoder.cpp is not None
    twin = copy.deepcopy(model)
    assert twin.kernels is not model.kernels and twin.kernels.chosen() == model.kernels.chosen()
    assert twin.kernels.encoder.cpp is model.kernels.encoder.cpp
    batch = random_batch([9, 5, 7], [4, 3, 4], vocab=60)
    with torch.no_grad():
        assert torch.equal(twin(batch).log_probs, model(batch).log_probs)
        twin.encoders.embedding.weight.add_(1.0)
        assert not torch.equal(twin(batch).log_probs, model(batch).log_probs)
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(model.parameters(), twin.parameters()))
    assert isinstance(AveragedModel(model).module, type(model))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_chosen_kernels_are_described_through_one_public_dict(precision: str) -> None:
    """What benchmarks and reports learn of the kernels: ``describe()``; ``Kernels`` itself has
    no method of one CPU kernel (AMX) and the CPU's features come from the package."""
    kernels = fast.select("cpu", precision, _config("iaa", "simd"))
    described = kernels.describe()
    assert described["device"] == "cpu" and described["precision"] == precision
    assert described["slots"] == kernels.chosen()
    assert isinstance(described["amx_recurrence"], bool) and isinstance(described["amx_step_layers"], bool)
    if precision == "fp32":
        assert not described["amx_recurrence"] and not described["amx_step_layers"]   # AMX is bf16 only
    assert not [name for name in vars(fast.Kernels) if "amx" in name]
    assert fast.cpu_features() == gru_kernels.cpu_features()


def test_forward_runs_whatever_function_a_slot_holds_at_its_one_call_site() -> None:
    """Each slot is one function of tensors and weights, called at one site: a wrapper placed in
    the encoder, table and steps slots runs for the query and the document in training, for the
    query, the document table and the T steps in inference (not the steps with a trace), and
    changes nothing."""
    cpp = _cpp()
    if cpp is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    torch.manual_seed(0)
    model = build_reader(_config("iaa", "generic")).eval()
    model.kernels = dataclasses.replace(model.kernels, steps=FusedSteps(cpp, "fp32", generic=True))
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=3)
    with torch.no_grad():
        before = model(batch).log_probs
    calls = []

    def recorded(name, slot):
        return lambda *args: calls.append(name) or slot(*args)

    slots = model.slots
    assert slots.encoder is not None and slots.table is not None and slots.steps is not None
    model.slots = dataclasses.replace(slots, encoder=recorded("encoder", slots.encoder),
                                      table=recorded("table", slots.table), steps=recorded("steps", slots.steps))
    model.train()
    out = model(batch)
    assert calls == ["encoder", "encoder"] and out.trace is None and out.halting is None
    model.eval()
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(batch).log_probs, before, atol=0, rtol=0)
        assert calls == ["encoder", "table", "steps"]
        calls.clear()
        model(batch, trace=True)
        assert calls == ["encoder", "table"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_slot_receives_tensors_and_weights_never_the_reader(precision: str) -> None:
    """Every slot's arguments are tensors, numbers or the weights it needs (``nn.Linear``,
    ``nn.GRU``, ``nn.GRUCell``, alone or in a list): never the reader, its encoders or a function
    to call back; every slot with a kernel runs in a training pass or an inference pass."""
    torch.manual_seed(0)
    model = build_reader(_config("iaa", "simd", DROPOUT), "cpu", precision)
    batch = random_batch([20, 25, 9, 16], [5, 7, 3, 6], vocab=60, seed=4)
    ran = set()

    def checked(name, slot):
        def run(*args):
            for arg in args:
                for item in arg if isinstance(arg, list) else [arg]:
                    assert isinstance(item, (torch.Tensor, int, float, nn.Linear, nn.GRU, nn.GRUCell)), (name, item)
            ran.add(name)
            return slot(*args)
        return run

    chosen = {f.name: slot for f in dataclasses.fields(model.slots) if (slot := getattr(model.slots, f.name))}
    assert {"encoder", "table", "reads", "dropout"} <= set(chosen)
    model.slots = fast.Slots(**{name: checked(name, slot) for name, slot in chosen.items()})
    nll_loss(model.train()(batch).log_probs, batch.answer).backward()
    with torch.no_grad():
        model.eval()(batch)
    assert ran == set(chosen)
