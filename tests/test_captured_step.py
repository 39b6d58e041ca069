"""The training step replayed from CUDA graphs (iaa.jobs.training.captured).

On the CPU: the bucket shapes and input buffers, the clipping factor that reads nothing back,
the capturable optimiser (it must train exactly as today's), why a reader is refused, and the
``train.cuda_graphs`` switch in configs and old checkpoints. Marked ``gpu``: replays equal eager
steps, and dropout draws new masks at every replay.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from iaa.data.loading.batch import pad_to_buckets
from iaa.jobs.config.job_config import JobConfig, TrainConfig, from_dict
from iaa.jobs.modeling import checkpoint
from iaa.jobs.train import bench
from iaa.jobs.modeling import graphs
from iaa.jobs.training import captured
from iaa.jobs.training.step import build_optimizer, clip_coefficient, train_step
from iaa.model.config import PRESETS
from iaa.model.reader import build_reader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from device_gpu import PaddedLoop as PaddedLoopEncoder  # noqa: E402  (the runner's capturable stand-in encoder)

VOCAB = 60


def _cfg(**changes):
    return replace(PRESETS["tiny"], vocab_size=VOCAB, **changes)


def _twin(reader: torch.nn.Module) -> torch.nn.Module:
    """Another reader of the same config, device and weights."""
    device = next(reader.parameters()).device
    other = build_reader(reader.cfg, device, reader.precision).to(device)
    other.load_state_dict(reader.state_dict())
    other.kernels = replace(other.kernels, encoder=reader.kernels.encoder)
    return other


def _batches(n: int, size: int = 3, seed: int = 0, device: str = "cpu"):
    pool = bench.synthetic_examples(n * size, seed=seed, vocab_size=VOCAB)
    return [bench.collate(group, device) for group in bench.bucketed_batches(pool, size, seed)]


# --- on the CPU --------------------------------------------------------------------------------


def test_bucketed_batches_have_few_shapes_and_buffers_take_each_batch_of_theirs() -> None:
    batches = [pad_to_buckets(b) for b in _batches(12)]
    shapes = {graphs.shape_of(b) for b in batches}
    assert len(shapes) < len(batches)                                      # shapes repeat: graphs are reused
    for b in batches:
        b_, ld, _, c, teacher = graphs.shape_of(b)
        assert (b_, c, teacher) == (3, bench.NUM_CANDS, False)
        assert ld in (128, 192, 256, 384, 512, 768, 1024) and ld >= b.doc_mask.sum(1).max()
    buffers = graphs.static_copy(batches[0])
    assert buffers.doc_lengths is None and buffers.query_lengths is None
    same = next(b for b in batches[1:] if graphs.shape_of(b) == graphs.shape_of(batches[0]))
    graphs.fill(buffers, same)
    for name in ("doc", "doc_mask", "query", "query_mask", "doc_cand", "cand_mask", "answer"):
        assert torch.equal(getattr(buffers, name), getattr(same, name)), name
    assert buffers.doc.data_ptr() != same.doc.data_ptr()


@pytest.mark.parametrize("max_norm", [0.05, 1e3])                         # clipped, and not
def test_the_clipping_factor_scales_as_clip_grad_norm(max_norm: float) -> None:
    torch.manual_seed(0)
    grads = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, 2)]
    reference = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(reference, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(reference, max_norm)
    sq_norm = sum(g.double().square().sum() for g in grads)
    coef = clip_coefficient(sq_norm, max_norm)
    assert isinstance(coef, torch.Tensor) and coef.dim() == 0 and coef.item() <= 1.0
    for p, g in zip(reference, grads):
        torch.testing.assert_close(g * coef.float(), p.grad, rtol=1e-6, atol=1e-7)
    assert (coef.item() == 1.0) == (max_norm == 1e3)


@pytest.mark.parametrize("sparse", [False, True])
def test_the_capturable_optimiser_trains_as_todays(sparse: bool) -> None:
    """Same weights after a few steps, through a learning-rate decay and a state round trip."""
    cfg = _cfg(dropout=0.0, sparse_embedding_grad=sparse)
    torch.manual_seed(1)
    today = build_reader(cfg)
    capture = _twin(today)
    opt_today = build_optimizer(today, lr=0.01, embed_l2=1e-3)
    opt_capture = build_optimizer(capture, lr=0.01, embed_l2=1e-3, capturable=True)
    assert isinstance(opt_capture.param_groups[0]["lr"], torch.Tensor)
    for i, batch in enumerate(_batches(4)):
        if i == 2:
            opt_today.set_lr(0.004)
            opt_capture.set_lr(0.004)
            state = opt_capture.state_dict()
            assert all(isinstance(g["lr"], float) for g in state["param_groups"])   # checkpoints hold floats
            opt_capture.load_state_dict(checkpoint.to_cpu(state))
            assert opt_capture.param_groups[0]["capturable"] and opt_capture.lr == pytest.approx(0.004, rel=1e-6)
        a = train_step(today, opt_today, batch, clip=0.5)
        b = train_step(capture, opt_capture, batch, clip=0.5)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    for (name, p), q in zip(today.named_parameters(), capture.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)
    other = build_optimizer(_twin(today), lr=0.01, embed_l2=1e-3)          # and back to today's kind
    other.load_state_dict(opt_capture.state_dict())
    assert other.lr == pytest.approx(0.004, rel=1e-6) and not other.param_groups[0]["capturable"]


def test_a_reader_that_needs_the_host_is_refused_with_its_reason() -> None:
    reader = build_reader(_cfg(fused_gru=False), "cuda")                 # packed nn.GRU, built for CUDA
    assert "CUDA device" in captured.refusal(reader, "cpu")
    assert "lengths on the host" in captured.refusal(reader, "cuda")
    assert captured.refusal(build_reader(_cfg(), "cuda"), "cuda") is None  # the padded encoder (PaddedGRU)
    assert "train.compile" in captured.refusal(reader, "cuda", compile=True)
    reader.kernels = replace(reader.kernels, encoder=PaddedLoopEncoder())
    assert captured.refusal(reader, "cuda") is None
    wrapped = torch.nn.Module()
    wrapped.module = reader
    assert "distributed" in captured.refusal(wrapped, "cuda")
    act = build_reader(_cfg(halting="act"), "cuda")
    act.kernels = replace(act.kernels, encoder=PaddedLoopEncoder())
    assert "halting='act'" in captured.refusal(act, "cuda")


def test_a_captured_step_needs_a_capturable_optimiser() -> None:
    reader = build_reader(_cfg())
    with pytest.raises(ValueError, match="capturable=True"):
        captured.CapturedStep(reader, build_optimizer(reader, lr=0.01, embed_l2=0.0))


def test_cuda_graphs_is_a_train_setting_that_old_checkpoints_and_resumes_accept() -> None:
    assert TrainConfig().cuda_graphs is True
    saved = asdict(JobConfig())
    del saved["train"]["cuda_graphs"]                                      # a checkpoint written before it
    assert from_dict(saved).train.cuda_graphs is True
    off = JobConfig(train=TrainConfig(cuda_graphs=False))
    state = {"config": asdict(JobConfig()), "vocab_hash": ""}
    checkpoint.check_resumable(state, off, "", "a test checkpoint")         # no CheckpointError


def test_on_cuda_the_reader_drops_out_with_torchs_generator() -> None:
    """The fast CPU dropout is not chosen on CUDA: ``F.dropout`` runs there, drawing from torch's
    default generator of the tensor's device (no host draw, no generator of its own), whose
    draws graph capture registers (each replay advances the generator's offset)."""
    assert build_reader(_cfg(), "cpu").kernels.dropout is not None
    cuda_reader = build_reader(_cfg(dropout=0.3), "cuda").train()
    assert cuda_reader.kernels.dropout is None and cuda_reader.slots.dropout is None
    drop = cuda_reader._drop                                               # the reader's dropout
    x = torch.ones(64, 32)
    torch.manual_seed(3)
    first = drop(x)
    torch.manual_seed(3)
    assert torch.equal(first, torch.nn.functional.dropout(x, 0.3, training=True))   # the default generator's draw
    torch.manual_seed(3)
    drop(x)
    assert not torch.equal(drop(x), first)                                 # ... and it advances it


class _Replayed:
    """A stand-in for a captured graph on the CPU: a replay recomputes the pass into its output buffer."""

    def __init__(self, fn, output: torch.Tensor) -> None:
        self.fn, self.output, self.replays = fn, output, 0

    def replay(self) -> None:
        self.replays += 1
        self.output.copy_(self.fn())


def _stand_in_capture(monkeypatch) -> None:
    """The side stream's two CUDA pieces on the CPU: the warm-up runs eagerly, capture records ``fn``."""
    def capture(self, fn):
        output = fn()
        return _Replayed(fn, output), output

    monkeypatch.setattr(graphs.GraphStream, "warm_up", lambda self, fn: fn())
    monkeypatch.setattr(graphs.GraphStream, "capture", capture)


def test_the_captured_forward_pads_captures_each_shape_once_and_refills_its_buffers(monkeypatch) -> None:
    _stand_in_capture(monkeypatch)
    torch.manual_seed(0)
    reader = build_reader(_cfg(dropout=0.0)).eval()
    batches = _batches(8, size=3)
    forward = graphs.CapturedForward(reader)
    with torch.no_grad():
        for batch in batches * 2:
            torch.testing.assert_close(forward(batch), reader(batch).log_probs)      # padded: the same answers
    shapes = {graphs.shape_of(pad_to_buckets(b)) for b in batches}
    assert set(forward.graphs) == shapes and forward.eager_calls == len(shapes)
    assert sum(g.graph.replays for g in forward.graphs.values()) == 2 * len(batches) - len(shapes)


def test_the_captured_forward_runs_shapes_past_its_limit_and_after_a_failed_capture_eagerly(monkeypatch) -> None:
    _stand_in_capture(monkeypatch)
    reader = build_reader(_cfg(dropout=0.0)).eval()
    batches = _batches(8, size=3)
    limited = graphs.CapturedForward(reader, max_graphs=1)
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(limited(batch), reader(batch).log_probs)
    assert len(limited.graphs) == 1

    def refuse(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(graphs.GraphStream, "capture", refuse)
    failed = graphs.CapturedForward(reader)
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(failed(batch), reader(batch).log_probs)
    assert failed.graphs == {} and "operation not permitted" in failed.failed and failed.eager_calls == len(batches)


def test_validation_scores_the_same_through_a_forward_and_reads_back_once(monkeypatch) -> None:
    from iaa.jobs.evaluation.evaluate import score_batches

    _stand_in_capture(monkeypatch)
    torch.manual_seed(0)
    reader = build_reader(_cfg(dropout=0.0))
    batches = _batches(8, size=3)
    correct, total, nll = score_batches(reader, batches)
    assert total == 24 and 0 <= correct <= 24 and nll > 0
    with torch.no_grad():
        expected = sum(torch.nn.functional.nll_loss(reader(b).log_probs, b.answer, reduction="sum").item() for b in batches)
    assert nll == pytest.approx(expected, rel=1e-5)
    reads = []
    tolist, item = torch.Tensor.tolist, torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append((t.dtype, tuple(t.shape))) or tolist(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append((t.dtype, "item")) or item(t))
    assert score_batches(reader, batches, forward=graphs.CapturedForward(reader)) == pytest.approx([correct, total, nll])
    assert [r for r in reads if r[0] != torch.int64] == [(torch.float64, (2,))]   # the sums, once (lengths aside)


# --- on a CUDA device --------------------------------------------------------------------------


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU machine")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield "cuda"
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _capturable_reader(cfg, device: str):
    reader = build_reader(cfg, device).to(device)
    reader.kernels = replace(reader.kernels, encoder=PaddedLoopEncoder())
    return reader


@pytest.mark.gpu
def test_replays_equal_eager_steps(cuda: str) -> None:
    torch.manual_seed(0)
    eager = _capturable_reader(_cfg(dropout=0.0), cuda)
    graphed = _twin(eager)
    opt_eager = build_optimizer(eager, lr=0.01, embed_l2=1e-3, capturable=True)
    opt_graphed = build_optimizer(graphed, lr=0.01, embed_l2=1e-3, capturable=True)
    step = captured.CapturedStep(graphed, opt_graphed, clip=0.5)
    batches = [pad_to_buckets(b) for b in _batches(6, device=cuda)]
    for i, batch in enumerate(batches * 2):                                # every shape replayed
        if i == 12:
            opt_eager.set_lr(0.003)
            opt_graphed.set_lr(0.003)                                      # seen by graphs captured before
        a = train_step(eager, opt_eager, batch, clip=0.5)
        b = step(batch)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert 0 < len(step.graphs) == step.eager_calls < len(batches) * 2
    for (name, p), q in zip(eager.named_parameters(), graphed.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.gpu
def test_the_cuda_dropout_slot_draws_a_new_mask_at_every_replay(cuda: str) -> None:
    """The reader's dropout on CUDA, captured alone: two replays give two masks."""
    drop = build_reader(_cfg(dropout=0.3), cuda).train()._drop
    x = torch.ones(256, 64, device=cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        drop(x)                                                            # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = drop(x)
    masks = []
    for _ in range(2):
        graph.replay()
        masks.append(out != 0)
    assert not torch.equal(masks[0], masks[1])
    assert 0.6 < float(masks[0].float().mean()) < 0.8                        # keep probability 0.7


def _gradients(reader: torch.nn.Module) -> torch.Tensor:
    """Every gradient the last step left (the embedding's goes to the optimiser), as one vector."""
    return torch.cat([p.grad.flatten() for p in reader.parameters() if p.grad is not None])


@pytest.mark.gpu
def test_dropout_draws_new_masks_at_every_replay(cuda: str) -> None:
    """With the learning rate 0 the weights stay put, so two replays on one batch differ only by
    their dropout masks. The gradients show it: the loss of a freshly initialised tiny reader
    hardly depends on its masks (about 1e-6 relative between two eager steps, within float
    noise), its gradients do (about 0.6 relative)."""
    batch = pad_to_buckets(_batches(1, device=cuda)[0])
    for dropout, differ in ((0.3, True), (0.0, False)):
        torch.manual_seed(0)
        reader = _capturable_reader(_cfg(dropout=dropout), cuda)
        optimizer = build_optimizer(reader, lr=0.0, embed_l2=0.0, capturable=True)
        step = captured.CapturedStep(reader, optimizer)
        step(batch)                                                        # warm-up and capture
        assert len(step.graphs) == 1 and step.failed is None
        grads = []
        for _ in range(2):                                                 # two replays
            step(batch)
            grads.append(_gradients(reader).clone())                       # graph memory: rewritten next replay
        apart = float((grads[0] - grads[1]).norm() / grads[0].norm())
        assert (apart > 1e-2) is differ and (apart < 1e-4) is not differ, (dropout, apart)


@pytest.mark.gpu
def test_the_loop_on_cuda_trains_from_graphs_or_names_its_refusal(cuda: str, tmp_path) -> None:
    """The default reader on CUDA (the padded encoder, capturable) trains from graphs and ends
    where the eager loop ends; a reader on the packed encoder (``fused_gru`` off: lengths on the
    host) is refused with its reason and trains eagerly, as many steps."""
    from iaa.jobs.datasets import resolve
    from iaa.jobs.train import train as train_job
    from tests._tiny import TINY_SETS, make_tiny_prepared

    prepared = make_tiny_prepared(tmp_path / "data")
    cfg = resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, "model.dropout=0", "train.max_epochs=1",
                                                     "train.precision=fp32"))
    assert cfg.model.fused_gru
    graphed = train_job.run(cfg, prepared, tmp_path / "graphed", device=cuda, show_progress=False)
    eager = train_job.run(replace(cfg, train=replace(cfg.train, cuda_graphs=False)), prepared, tmp_path / "eager",
                          device=cuda, show_progress=False)
    packed = replace(cfg, model=replace(cfg.model, fused_gru=False))
    refused = train_job.run(packed, prepared, tmp_path / "refused", device=cuda, show_progress=False)
    assert graphed.metrics["cuda_graphs"] is True and graphed.metrics["cuda_graphs_refused"] is None
    assert eager.metrics["cuda_graphs"] is False and eager.metrics["cuda_graphs_refused"] is None
    assert refused.metrics["cuda_graphs"] is False and "lengths on the host" in refused.metrics["cuda_graphs_refused"]
    assert graphed.steps == eager.steps == refused.steps > 0
    assert graphed.metrics["train_loss"] == pytest.approx(eager.metrics["train_loss"], rel=1e-3)
    assert graphed.metrics["valid_loss"] == pytest.approx(eager.metrics["valid_loss"], rel=1e-3)


@pytest.mark.gpu
def test_forward_replays_equal_eager_passes_and_follow_the_weights(cuda: str) -> None:
    torch.manual_seed(0)
    reader = _capturable_reader(_cfg(dropout=0.0), cuda)
    forward = graphs.CapturedForward(reader)
    batches = _batches(6, device=cuda)
    optimizer = build_optimizer(reader, lr=0.05, embed_l2=1e-3, capturable=True)
    for round_ in range(3):
        reader.eval()
        with torch.no_grad():
            for batch in batches:
                torch.testing.assert_close(forward(batch).clone(), reader(batch).log_probs, rtol=1e-4, atol=1e-5)
        reader.train()
        train_step(reader, optimizer, pad_to_buckets(batches[round_]))     # the weights change in place
    assert forward.failed is None and 0 < len(forward.graphs) == forward.eager_calls < 3 * len(batches)
