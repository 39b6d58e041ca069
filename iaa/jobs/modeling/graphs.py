"""CUDA graphs of the reader: which readers can be captured, the input buffers of a graph, and the
forward pass replayed from graphs (inference: validation and the bench).

The training step's graphs (:mod:`iaa.jobs.training.captured`) build on the same pieces. Batches
are padded to bucketed widths (:func:`iaa.data.loading.batch.pad_to_buckets`), so a run sees a handful of
shapes; each shape is captured once, and later batches of that shape are copied into the graph's
input buffers and replayed with one launch instead of the thousands of small kernels of an eager
pass, which at batch 32 the host, not the GPU, sets the pace of.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from iaa.data.loading.batch import Batch, pad_to_buckets
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


class GraphStream:
    """The side stream and memory pool that a set of graphs is warmed up and captured on.

    The graphs share the pool: they never run at once (one stream, in order) and each keeps
    alive only its inputs and output, so their intermediates may share memory.
    """

    def __init__(self) -> None:
        self.pool = None
        self.stream: torch.cuda.Stream | None = None

    def warm_up(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``fn()`` eagerly on the side stream (it allocates what capture then reuses); its result,
        safe to read on the current stream."""
        if self.stream is None:
            self.pool, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = fn()
        current.wait_stream(self.stream)
        out.record_stream(current)                                         # made on the side stream, read here
        return out

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """``fn()`` captured in a graph of the pool on the side stream (after :meth:`warm_up`); the
        graph and the output buffer it writes. Raises RuntimeError for an operation capture forbids."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: the prefetching thread may pin host memory meanwhile, which a global
        # capture would forbid to every thread.
        with autocast_cache_off(), torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                                                    capture_error_mode="thread_local"):
            out = fn()
        return graph, out


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: Batch          # the buffers the graph reads
    output: torch.Tensor   # the buffer the graph writes


class ShapeGraphs:
    """``fn(batch)`` replayed from CUDA graphs, one per batch shape, all on one :class:`GraphStream`.

    A batch is padded to bucketed widths first (:func:`iaa.data.loading.batch.pad_to_buckets`). The first
    batch of a shape runs ``fn`` eagerly on the side stream (the warm-up), then ``fn`` is captured
    for that shape; capture runs nothing, so ``fn`` runs once per batch. Later batches of the
    shape are copied into the graph's input buffers and the graph replays. What a call returns is
    then the graph's output buffer, rewritten by the next replay of its shape. Shapes beyond
    ``max_graphs``, and every batch after a capture failed (``failed`` says why), run eagerly.
    """

    what = "pass"          # what ``fn`` is, in ``failed``

    def __init__(self, fn: Callable[[Batch], torch.Tensor], max_graphs: int = MAX_GRAPHS) -> None:
        self.fn, self.max_graphs = fn, max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.eager_calls = 0            # warm-ups and shapes beyond max_graphs
        self.failed: str | None = None
        self.side = GraphStream()

    def __call__(self, batch: Batch) -> torch.Tensor:
        batch = pad_to_buckets(batch)
        captured = self.graphs.get(shape_of(batch))
        if captured is None:
            self.eager_calls += 1
            if len(self.graphs) >= self.max_graphs:
                return self.fn(batch)
            return self._warm_up_and_capture(batch)
        fill(captured.inputs, batch)
        captured.graph.replay()
        return captured.output

    def _warm_up_and_capture(self, batch: Batch) -> torch.Tensor:
        out = self.side.warm_up(lambda: self.fn(batch))
        inputs = static_copy(batch)
        try:
            graph, output = self.side.capture(lambda: self.fn(inputs))
        except RuntimeError as err:     # an operation capture forbids: go on eagerly
            self.failed = f"capturing the {self.what} failed ({str(err).splitlines()[0]}); {self.what}s run eagerly"
            self.max_graphs = 0
            return out
        self.graphs[shape_of(batch)] = _Graph(graph, inputs, output)
        return out


class CapturedForward(ShapeGraphs):
    """``model(batch).log_probs`` under ``torch.no_grad``, replayed from CUDA graphs (:class:`ShapeGraphs`).

    ``model`` is a reader that :func:`refusal` accepts, on a CUDA device, in eval mode when called
    (a graph replays the mode it was captured in). A call returns the batch's (B, C)
    log-probabilities, those of the unpadded batch (the reader masks padding); reduce or copy
    them before the next call. The graphs read the parameters where they are, so they follow the
    training that updates them in place.
    """

    what = "forward pass"

    def __init__(self, model: nn.Module, max_graphs: int = MAX_GRAPHS) -> None:
        super().__init__(lambda batch: model(batch).log_probs, max_graphs)

    @torch.no_grad()
    def __call__(self, batch: Batch) -> torch.Tensor:
        return super().__call__(batch)
