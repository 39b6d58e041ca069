"""The accelerator's code path, checked on the CPU: no host syncs in a training step, the GRU's
dtype in bf16, the FLOP formula, compiled reads, bucketed shapes and prefetched batches.

Tolerances: compiled and eager reads compute the same float32 operations, but the compiler fuses
and reorders reductions, so outputs are held to 1e-5 absolute / 1e-4 relative (log-probabilities
near -2) and gradients to 1e-5 / 1e-3.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from _faults import assert_says
from iaa.data.loading.batch import DOC_MULTIPLE, QUERY_MULTIPLE, bucket_width, pad_to_buckets, pad_to_multiple
from iaa.data.loading.prefetch import prefetch
from iaa.jobs.training.step import build_optimizer, train_step
from iaa.model import MODEL_KINDS, build_reader, nll_loss, preset
from iaa.model.encoder import BiGRUEncoder
from iaa.jobs.train.flops import batch_flops, step_layer_flops
from iaa.model.reader import CompiledReads, Masks
from tests._fake_device import HostReads, batch_on_fake_device, on_fake_device
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(300)
REFERENCE = dict(fused_gru=False, batched_read_grad=False, sparse_embedding_grad=False, fast_dropout=False)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_training_steps_read_nothing_back_from_the_device(kind: str) -> None:
    """Between two checks the host never waits for the device: no copy back, no scalar read,
    no op whose output size depends on the data. The model and batch sit on a stand-in
    accelerator (``tests/_fake_device.py``), so every device-dependent branch takes its GPU side.

    Adam's own step is not counted: off CUDA and CPU, torch's Adam keeps its step count on the
    host and reads it; on CUDA ``build_optimizer`` uses the fused kernel, which reads nothing.
    """
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, kind=kind, steps=3))      # default switches
    batches = [random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=s) for s in range(3)]
    reads = HostReads()
    with reads:
        on_fake_device(model)
        optimizer = build_optimizer(model, lr=1e-3, embed_l2=1e-4)
        adam_step = optimizer.adam.step

        def uncounted_step(*args, **kwargs):
            reads.paused = True
            try:
                return adam_step(*args, **kwargs)
            finally:
                reads.paused = False

        optimizer.adam.step = uncounted_step
        total = 0.0
        for batch in batches:
            total = total + train_step(model, optimizer, batch_on_fake_device(batch), clip=0.05)
        assert reads.reads == [], "\n".join(reads.reads)
        assert not optimizer.embedding.grad.is_sparse                   # the device's dense gradient
        loss = float(total) / len(batches)                               # the check reads it: once
    assert len(reads.reads) == 1 and "_local_scalar_dense" in reads.reads[0]
    assert 0 < loss < 10


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_the_accelerator_path_never_loads_the_cpp_recurrence(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C++ kernels are CPU kernels: building them (15-40 s) would be wasted on a GPU run. A
    reader built for the stand-in accelerator never asks for them, in a training step or in an
    inference pass."""
    from _fake_device import DEVICE
    from iaa.model.kernels import gru_kernels

    def refuse():
        raise AssertionError("the accelerator path asked for the C++ kernels")

    monkeypatch.setattr(gru_kernels, "load", refuse)
    monkeypatch.setattr(gru_kernels, "build", refuse)
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, kind=kind, steps=3), DEVICE)   # default switches
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=0)
    with HostReads():
        on_fake_device(model)
        optimizer = build_optimizer(model, lr=1e-3, embed_l2=1e-4)
        on_device = batch_on_fake_device(batch)
        train_step(model, optimizer, on_device, clip=0.05)
        model.eval()
        with torch.no_grad():
            model(on_device)


def test_autocast_is_off_inside_the_gru_which_runs_in_an_explicit_dtype() -> None:
    """Autocast's cuDNN rule would run a GRU in fp16 under bf16 autocast; the encoder turns
    autocast off around ``nn.GRU`` and casts its input and weights itself: bf16 in precision
    bf16 (here, on the CPU; on CUDA with cuDNN >= 9.13), fp32 otherwise, never fp16, whatever
    autocast the caller has on."""
    torch.manual_seed(0)
    encoder = BiGRUEncoder(12, 8)
    seen: list[tuple[bool, torch.dtype, set]] = []

    def record(module, args):
        packed = args[0]
        seen.append((torch.is_autocast_enabled("cpu"), packed.data.dtype,
                     {getattr(module, name).dtype for name in module._flat_weights_names}))

    encoder.gru.register_forward_pre_hook(record)
    x = torch.randn(3, 7, 12, requires_grad=True)
    mask = torch.arange(7) < torch.tensor([7, 4, 1]).unsqueeze(1)
    cases = (("bf16", torch.bfloat16, torch.bfloat16), ("bf16", None, torch.bfloat16),
             ("fp32", torch.float16, torch.float32), ("fp32", torch.bfloat16, torch.float32), ("fp32", None, torch.float32))
    for precision, dtype, expected in cases:
        seen.clear()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            states, final = encoder(x, mask, precision=precision)
        assert seen == [(False, expected, {expected})], (precision, dtype, seen)
        assert states.dtype == expected and final.dtype == expected
        (grad,) = torch.autograd.grad(states.float().sum() + final.float().sum(), x)
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all()
        assert all(p.dtype == torch.float32 for p in encoder.parameters())


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_flop_formula_equals_the_flop_counter_on_the_reference_path(kind: str) -> None:
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=40, kind=kind, steps=3, **REFERENCE)
    model = build_reader(cfg)
    optimizer = build_optimizer(model, lr=1e-3, embed_l2=1e-4)
    for doc_lens in ([9, 14, 5, 14], [9, 14, 5, 11]):                # one and two rows at the longest
        batch = random_batch(doc_lens, [4, 6, 3, 6], seed=1, pad_to=(17, 8))  # padded beyond the longest
        counter = FlopCounterMode(display=False)
        with counter:
            train_step(model, optimizer, batch)
        assert batch_flops(cfg, batch) == counter.get_total_flops()


def test_flop_formula_of_act_equals_the_flop_counter_when_every_example_runs_t_max_steps() -> None:
    """ACT is counted as T_max steps plus the halting unit after each step but the last: exact
    when no example halts before T_max (halting biases far below 0)."""
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=40, steps=3, halting="act", **REFERENCE)
    model = build_reader(cfg)
    with torch.no_grad():
        model.halting_unit.bias.fill_(-30.0)
    optimizer = build_optimizer(model, lr=1e-3, embed_l2=1e-4)
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 6], seed=1, pad_to=(17, 8))
    counter = FlopCounterMode(display=False)
    with counter:
        train_step(model, optimizer, batch)
    fixed = batch_flops(replace(cfg, halting="none"), batch)
    assert batch_flops(cfg, batch) == counter.get_total_flops() > fixed


def test_flops_of_a_reader_the_formula_does_not_know_are_an_error() -> None:
    cfg = preset("tiny", vocab_size=40)
    batch = random_batch([9, 14], [4, 6], seed=1)
    for field, value in (("kind", "iaa-two-queries"), ("halting", "pondernet")):
        unknown = SimpleNamespace(**{**asdict(cfg), field: value})
        with pytest.raises(ValueError, match=f"model.{field}={value!r} are not counted"):
            batch_flops(unknown, batch)
        with pytest.raises(ValueError, match=f"model.{field}={value!r}"):
            step_layer_flops(unknown, 4)


def test_step_layer_flops_are_the_attention_steps_weight_matmuls() -> None:
    """``step_layer_flops`` (what the bench counts as bf16 when the steps' layers run on AMX)
    equals what the flop counter sees of the steps' addmm/mm, forward and backward."""
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=40, steps=3, **REFERENCE)
    model = build_reader(cfg)
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 6], seed=1)
    two_h = 2 * cfg.hidden_dim
    q_enc = torch.randn(4, batch.query.shape[1], two_h, requires_grad=True)
    d_enc = torch.randn(4, batch.doc.shape[1], two_h, requires_grad=True)
    counter = FlopCounterMode(display=False)
    with counter:
        masks = Masks(batch.query_mask, batch.doc_mask, batch.doc_mask)
        log_att, _, _ = model._read(q_enc, q_enc[:, 0], d_enc, masks, trace=False)
        log_att[torch.isfinite(log_att)].sum().backward()
    counts = counter.get_flop_counts()["Global"]
    layers = sum(f for op, f in counts.items() if str(op) in ("aten.addmm", "aten.mm"))
    assert layers > 0 and step_layer_flops(cfg, 4) == layers


@pytest.mark.slow                              # inductor compiles for minutes on a small shared CPU
@pytest.mark.parametrize("kind", ["iaa", "as-reader"])
def test_compiled_reads_equal_eager_reads(kind: str) -> None:
    """``compile_reads`` (``train.compile``) computes what the eager reader does, in value and
    gradient, on the default (fast) switches."""
    torch.manual_seed(0)
    eager = build_reader(preset("tiny", vocab_size=40, kind=kind, steps=3, dropout=0.0))
    compiled = build_reader(preset("tiny", vocab_size=40, kind=kind, steps=3, dropout=0.0))
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_reads()
    batch = pad_to_buckets(random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=3))
    results = []
    for model in (eager, compiled):
        model.train()
        log_p = model(batch).log_probs
        nll_loss(log_p, batch.answer).backward()
        grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone() for n, p in model.named_parameters()}
        results.append((log_p.detach(), grads))
    (lp_e, g_e), (lp_c, g_c) = results
    finite = torch.isfinite(lp_e)
    assert torch.equal(finite, torch.isfinite(lp_c))
    torch.testing.assert_close(lp_c[finite], lp_e[finite], atol=1e-5, rtol=1e-4)
    for name in g_e:
        torch.testing.assert_close(g_c[name], g_e[name], atol=1e-5, rtol=1e-3, msg=name)
    assert isinstance(compiled._reads, CompiledReads)


def test_no_slot_runs_inside_the_compiled_reads(monkeypatch) -> None:
    """``compile_reads`` compiles the reference reads: no slot runs inside the traced graph. With
    dropout on, the fast dropout draws for the embeddings (the eager encoders) and no longer for
    the attention inputs and the gates' inputs (the compiled reads)."""
    from iaa.model.kernels.dropout import FastDropout

    drawn = []
    call = FastDropout.__call__
    monkeypatch.setattr(FastDropout, "__call__", lambda self, x, p: drawn.append(x.shape) or call(self, x, p))
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, steps=3, dropout=0.2)).train()
    batch = pad_to_buckets(random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=3))
    model(batch)
    assert len(drawn) == 2 + 2 + 2                       # embeddings, attention inputs, T - 1 gates' inputs
    drawn.clear()
    model.compile_reads(backend="eager")                 # dynamo's tracing alone: seconds
    model(batch)
    assert len(drawn) == 2 and isinstance(model._reads, CompiledReads)


def test_bucketed_padding_keeps_the_output_and_few_shapes() -> None:
    assert [bucket_width(n) for n in (1, 16, 17, 24, 25, 33, 430, 1000)] == [16, 16, 24, 24, 32, 48, 512, 1024]
    assert len({bucket_width(n) for n in range(130, 1001)}) == 6                 # CBT documents
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, dropout=0.0)).eval()
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=3)
    padded = pad_to_buckets(batch)
    assert padded.doc.shape[1] == 16 and padded.query.shape[1] == 16
    with torch.no_grad():
        torch.testing.assert_close(model(padded).log_probs, model(batch).log_probs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_padding_to_multiples_keeps_the_output_and_the_gradients(kind: str) -> None:
    """The CPU training loop pads widths to multiples (few sizes for the heap to reuse): the
    reader's log-probabilities and gradients are those of the batch as loaded."""
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, kind=kind, dropout=0.0)).train()
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=3)
    padded = pad_to_multiple(batch)
    assert (padded.doc.shape[1], padded.query.shape[1]) == (DOC_MULTIPLE, QUERY_MULTIPLE)
    assert pad_to_multiple(padded) is padded                                   # already at a multiple
    results = []
    for b in (batch, padded):
        model.zero_grad()
        log_p = model(b).log_probs
        nll_loss(log_p, b.answer).backward()
        results.append((log_p.detach(), {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
                                         for n, p in model.named_parameters() if p.grad is not None}))
    (lp, grads), (lp_padded, grads_padded) = results
    torch.testing.assert_close(lp_padded, lp, atol=1e-6, rtol=1e-5)
    assert grads.keys() == grads_padded.keys()
    for name in grads:
        torch.testing.assert_close(grads_padded[name], grads[name], atol=1e-6, rtol=1e-4, msg=name)


def test_prefetch_prepares_the_next_batch_while_the_current_one_is_used() -> None:
    """The background thread cuts batch k + 1 while the consumer still holds batch k (no timing:
    the producer signals, and the consumer waits for that signal before it lets go)."""
    made = [threading.Event() for _ in range(4)]

    def source():
        for i in range(4):
            batch = random_batch([5, 3], [2, 2], seed=i)
            made[i].set()
            yield batch

    seen = []
    for i, batch in enumerate(prefetch(source(), "cpu", depth=2)):
        seen.append(batch.doc)
        if i + 1 < 4:
            assert made[i + 1].wait(timeout=30), f"batch {i + 1} was not prepared while batch {i} was in use"
    assert [torch.equal(a, random_batch([5, 3], [2, 2], seed=i).doc) for i, a in enumerate(seen)] == [True] * 4


def test_prefetch_raises_the_sources_error_and_stops_when_closed() -> None:
    def failing():
        yield random_batch([5], [2])
        raise ValueError("bad shard")

    batches = prefetch(failing(), "cpu", depth=2)
    next(batches)
    with pytest.raises(ValueError, match="bad shard"):
        next(batches)
    endless = prefetch((random_batch([5], [2]) for _ in iter(int, 1)), "cpu", depth=2)
    next(endless)
    endless.close()                                  # joins the thread: it must not block on a full queue
    assert not any(t.name == "iaa-prefetch" and t.is_alive() for t in threading.enumerate())


def test_checkpoint_rng_belongs_to_the_models_device() -> None:
    """The CUDA RNG state saved is the model's GPU's (``model_device``), and it is restored onto
    the device the run continues on, never implicitly onto GPU 0 or onto a CPU run."""
    from iaa.jobs.modeling import checkpoint
    from iaa.jobs.config.job_config import JobConfig

    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40))
    optimizer = build_optimizer(model, lr=1e-3, embed_l2=1e-4)
    assert checkpoint.model_device(model) == torch.device("cpu")
    assert checkpoint.model_device(torch.nn.Module()) == torch.device("cpu")
    state = checkpoint.make_state(JobConfig(), model, optimizer)
    assert "cuda_rng" not in state                               # a CPU model saves no CUDA state
    expected = torch.rand(3)                                     # the draws after the save
    checkpoint.restore_rng({**state, "cuda_rng": torch.zeros(16, dtype=torch.uint8)}, "cpu")
    assert torch.equal(torch.rand(3), expected)                  # the CPU state, and nothing else, back
    with HostReads():
        on_fake_device(model)
        assert checkpoint.model_device(model).type == "meta"     # the parameters' device, whatever it is


def test_the_cost_estimate_says_when_sharing_a_gpu_pays() -> None:
    from iaa.jobs.sweeps.cost import SweepCost

    def text(share: float) -> str:
        return SweepCost(trials=8, epochs=2, examples=1000, examples_per_s=0.0, concurrency=8, gpus=True,
                         gpus_per_trial=share).describe()

    assert_says(text(0.25), "4 one-worker trials", "share each GPU", "idle")
    assert "share each GPU" not in text(1.0)
