"""CUDA graphs of the reader: which readers can be captured, the input buffers of a graph, and the
forward pass replayed from graphs (inference: validation and the bench).

The training step's graphs (:mod:`iaa.jobs.training.captured`) build on the same pieces. Batches
are padded to bucketed widths (:func:`iaa.data.batch.pad_to_buckets`), so a run sees a handful of
shapes; each shape is captured once, and later batches of that shape are copied into the graph's
input buffers and replayed with one launch instead of the thousands of small kernels of an eager
pass, which at batch 32 the host, not the GPU, sets the pace of.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from iaa.data.batch import Batch, pad_to_buckets
from iaa.jobs.modeling.checkpoint import unwrap

MAX_GRAPHS = 24     # shapes captured per run; the buckets give a handful, the last batch of an epoch one more
_HOST_FIELDS = ("example_ids", "doc_lengths", "query_lengths")


def refusal(model: nn.Module, device: torch.device | str) -> str | None:
    """Why a pass of ``model`` on ``device`` cannot be captured in a CUDA graph, or None.

    A pass can be captured when the reader's forward pass needs no value from the host: its
    encoder must be a kernel that declares ``capturable`` (``nn.GRU`` over packed sequences
    needs the lengths on the host), it must not halt adaptively (ACT ends its loop on a host
    check), and it must not be wrapped for distributed training (DDP's all-reduce hooks).
    """
    if torch.device(device).type != "cuda":
        return "CUDA graphs need a CUDA device"
    if hasattr(model, "module"):
        return "the model is wrapped for distributed training (its gradients are all-reduced by hooks)"
    reader = unwrap(model)
    if getattr(reader.cfg, "halting", "none") != "none":
        return f"halting={reader.cfg.halting!r} ends its steps on a value read back from the device"
    encoder = getattr(getattr(reader, "kernels", None), "encoder", None)
    if not getattr(encoder, "capturable", False):
        name = type(encoder).__name__ if encoder is not None else "nn.GRU over packed sequences"
        return (f"the reader's encoder ({name}) needs the sequence lengths on the host; a padded "
                "CUDA encoder kernel that declares itself capturable is needed")
    return None


def shape_of(batch: Batch) -> tuple:
    """What a graph is captured for: (B, Ld, Lq, C, with a teacher)."""
    return (*batch.doc.shape, batch.query.shape[1], batch.cand_mask.shape[1], batch.teacher is not None)


def static_copy(batch: Batch) -> Batch:
    """Input buffers of ``batch``'s shape on its device, holding a copy of it; no host lengths."""
    return replace(batch.map_tensors(torch.clone), doc_lengths=None, query_lengths=None, example_ids=[])


def fill(buffers: Batch, batch: Batch) -> None:
    """Copy ``batch`` (same shape, on the device) into the graph's input ``buffers``."""
    for f in fields(Batch):
        target = getattr(buffers, f.name)
        if f.name not in _HOST_FIELDS and target is not None:
            target.copy_(getattr(batch, f.name), non_blocking=True)


@contextmanager
def autocast_cache_off() -> Iterator[None]:
    """Autocast's cache of cast weights off during capture (torch's advice for graphs): a cast
    cached outside the graph would be replayed stale after the weights change."""
    before = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(before)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: Batch          # the buffers the graph reads
    output: torch.Tensor   # the buffer the graph writes


class CapturedForward:
    """``model(batch).log_probs`` under ``torch.no_grad``, replayed from CUDA graphs.

    Args:
        model: a reader that :func:`refusal` accepts, on a CUDA device, in eval mode when called
            (a graph replays the mode it was captured in).
        max_graphs: shapes captured; batches of further shapes run eagerly.

    Calling it with a batch on the device returns the batch's (B, C) log-probabilities, padded
    to bucketed widths first (the reader masks padding, so they are the unpadded batch's). The
    tensor is the graph's output buffer, rewritten by the next call of the same shape: reduce or
    copy it before then. The graph reads the model's parameters where they are, so it follows
    the training that updates them in place. A capture that fails leaves every later batch eager
    (``failed`` says why).
    """

    def __init__(self, model: nn.Module, max_graphs: int = MAX_GRAPHS) -> None:
        self.model, self.max_graphs = model, max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.eager_passes = 0           # warm-ups and shapes beyond max_graphs
        self.failed: str | None = None
        self._pool = None
        self._stream: torch.cuda.Stream | None = None

    @torch.no_grad()
    def __call__(self, batch: Batch) -> torch.Tensor:
        batch = pad_to_buckets(batch)
        captured = self.graphs.get(shape_of(batch))
        if captured is None:
            self.eager_passes += 1
            if len(self.graphs) >= self.max_graphs:
                return self.model(batch).log_probs
            return self._warm_up_and_capture(batch)
        fill(captured.inputs, batch)
        captured.graph.replay()
        return captured.output

    def _warm_up_and_capture(self, batch: Batch) -> torch.Tensor:
        """This batch's pass, eagerly (the warm-up), then the pass captured for its shape."""
        log_probs = self._warm_up(batch)
        inputs = static_copy(batch)
        try:
            graph, output = self._capture(lambda: self.model(inputs).log_probs)
        except RuntimeError as err:     # an operation capture forbids: go on eagerly
            self.failed = f"capturing the forward pass failed ({str(err).splitlines()[0]}); passes run eagerly"
            self.max_graphs = 0
            return log_probs
        self.graphs[shape_of(batch)] = _Graph(graph, inputs, output)
        return log_probs

    def _warm_up(self, batch: Batch) -> torch.Tensor:
        """The pass on the side stream, which allocates what capture then reuses."""
        if self._stream is None:
            self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        current = torch.cuda.current_stream()
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            log_probs = self.model(batch).log_probs
        current.wait_stream(self._stream)
        log_probs.record_stream(current)                                   # made on the side stream, read here
        return log_probs

    def _capture(self, fn) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """``fn()`` captured in a graph of the shared pool on the side stream; the graph and its output."""
        graph = torch.cuda.CUDAGraph()
        with autocast_cache_off(), torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                                    capture_error_mode="thread_local"):
            output = fn()
        return graph, output
