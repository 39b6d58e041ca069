"""A training step replayed from CUDA graphs: one graph per batch shape, all in one memory pool.

Why: at batch 32 an eager step launches thousands of small kernels, and the host that launches
them, not the GPU, sets the pace. A CUDA graph records a whole step (forward, backward, the
clipping and Adam) once and replays it with one launch.

How (the recipe of torch's "CUDA Graphs" notes, whole-network capture; the buffers and the
refusals are :mod:`iaa.jobs.modeling.graphs`, which the forward pass's graphs share):

- Lengths are padded to a few widths (``iaa.data.batch.pad_to_buckets``), so a run sees few
  shapes. The first batch of a shape is trained eagerly on a side stream (the warm-up: it
  allocates what the graph will reuse and creates Adam's state); then the same step,
  ``iaa.jobs.training.step.train_step``, is captured into a graph for that shape. Capture runs
  nothing, so every batch is trained exactly once. Later batches of that shape are copied into
  the graph's input buffers (``copy_``) and the graph is replayed.
- All graphs share one memory pool. They never run at once (one stream, in order) and each
  keeps alive only its inputs and its loss, so their intermediates may share memory.
- Nothing in a step reads a value back to the host: clipping scales by a device-side factor
  (``step.clip_coefficient``), Adam is capturable (its step count and learning rate are device
  tensors; the plateau decay writes the learning rate in place), and the loss stays on the device.
- Dropout draws fresh masks at each replay: graph capture registers CUDA's default generator,
  whose Philox offset advances at every replay.

A reader is captured only when its forward pass needs nothing from the host (``refusal`` says
why not); otherwise the loop runs today's eager step. At most ``MAX_GRAPHS`` shapes are
captured; batches of further shapes run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from iaa.data.batch import Batch, pad_to_buckets
from iaa.jobs.modeling import graphs
from iaa.jobs.modeling.graphs import MAX_GRAPHS, autocast_cache_off, fill, shape_of, static_copy
from iaa.jobs.modeling.objective import Objective
from iaa.jobs.training.step import Optimizer, train_step

def refusal(model: nn.Module, device: torch.device | str, *, compile: bool = False) -> str | None:
    """Why a training step of ``model`` on ``device`` cannot be captured in a CUDA graph, or None:
    :func:`iaa.jobs.modeling.graphs.refusal`, and ``train.compile``, which captures on its own."""
    if compile and torch.device(device).type == "cuda":
        return "train.compile already runs the attention steps under torch.compile"
    return graphs.refusal(model, device)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: Batch          # the buffers the graph reads
    loss: torch.Tensor     # the buffer the graph writes the step's loss to


class CapturedStep:
    """``train_step(model, optimizer, batch, clip=..., objective=...)`` replayed from CUDA graphs.

    Args:
        model: a reader that ``refusal`` accepts, on a CUDA device.
        optimizer: built with ``capturable=True``.
        clip, objective: as for ``train_step``.

    Calling it with a batch on the device returns the same value as ``train_step`` (a 0-dim
    float64 device tensor) and trains on the batch once.
    """

    def __init__(self, model: nn.Module, optimizer: Optimizer, *, clip: float = 5.0,
                 objective: Objective = Objective(), max_graphs: int = MAX_GRAPHS) -> None:
        if not optimizer.capturable:
            raise ValueError("a captured step needs an optimiser built with capturable=True")
        self.eager = partial(train_step, model, optimizer, clip=clip, objective=objective)
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.eager_steps = 0          # steps that ran eagerly: warm-ups and shapes beyond max_graphs
        self.failed: str | None = None  # why capturing failed, after which every step runs eagerly
        self._pool = None
        self._stream: torch.cuda.Stream | None = None

    def __call__(self, batch: Batch) -> torch.Tensor:
        batch = pad_to_buckets(batch)
        captured = self.graphs.get(shape_of(batch))
        if captured is None:
            self.eager_steps += 1
            if len(self.graphs) >= self.max_graphs:
                return self.eager(batch)
            return self._warm_up_and_capture(batch)
        fill(captured.inputs, batch)
        captured.graph.replay()
        return captured.loss.clone()                                       # the buffer is rewritten next replay

    def _warm_up_and_capture(self, batch: Batch) -> torch.Tensor:
        """This batch's step, eagerly on the side stream, then the step captured for its shape."""
        if self._stream is None:
            self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        current = torch.cuda.current_stream()
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            loss = self.eager(batch)
        current.wait_stream(self._stream)
        loss.record_stream(current)                                        # made on the side stream, read here
        inputs = static_copy(batch)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the prefetching thread may pin host memory meanwhile, which a global
        # capture would forbid to every thread.
        try:
            with autocast_cache_off(), torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                                         capture_error_mode="thread_local"):
                static_loss = self.eager(inputs)
        except RuntimeError as err:     # an operation capture forbids: train on, eagerly
            self.failed = f"capturing the step failed ({str(err).splitlines()[0]}); steps run eagerly"
            self.max_graphs = 0
            return loss
        self.graphs[shape_of(batch)] = _Graph(graph, inputs, static_loss)
        return loss
