"""A training step replayed from CUDA graphs: one graph per batch shape, all in one memory pool.

Why: at batch 32 an eager step launches thousands of small kernels, and the host that launches
them, not the GPU, sets the pace. A CUDA graph records a whole step (forward, backward, the
clipping and Adam) once and replays it with one launch.

How (the recipe of torch's "CUDA Graphs" notes, whole-network capture; the buffers and the
refusals are :mod:`iaa.jobs.modeling.graphs`, which the forward pass's graphs share):

- Lengths are padded to a few widths (``iaa.data.loading.batch.pad_to_buckets``), so a run sees few
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

from functools import partial

import torch
from torch import nn

from iaa.data.loading.batch import Batch
from iaa.jobs.modeling import graphs
from iaa.jobs.modeling.graphs import MAX_GRAPHS, ShapeGraphs
from iaa.jobs.modeling.objective import Objective
from iaa.jobs.training.step import Optimizer, train_step


def refusal(model: nn.Module, device: torch.device | str, *, compile: bool = False) -> str | None:
    """Why a training step of ``model`` on ``device`` cannot be captured in a CUDA graph, or None:
    :func:`iaa.jobs.modeling.graphs.refusal`, and ``train.compile``, which captures on its own."""
    if compile and torch.device(device).type == "cuda":
        return "train.compile already runs the attention steps under torch.compile"
    return graphs.refusal(model, device)


class CapturedStep(ShapeGraphs):
    """``train_step(model, optimizer, batch, clip=..., objective=...)`` replayed from CUDA graphs
    (:class:`iaa.jobs.modeling.graphs.ShapeGraphs`).

    Args:
        model: a reader that ``refusal`` accepts, on a CUDA device.
        optimizer: built with ``capturable=True``.
        clip, objective: as for ``train_step``.

    Calling it with a batch on the device returns the same value as ``train_step`` (a 0-dim
    float64 device tensor) and trains on the batch once.
    """

    what = "step"

    def __init__(self, model: nn.Module, optimizer: Optimizer, *, clip: float = 5.0,
                 objective: Objective = Objective(), max_graphs: int = MAX_GRAPHS) -> None:
        if not optimizer.capturable:
            raise ValueError("a captured step needs an optimiser built with capturable=True")
        super().__init__(partial(train_step, model, optimizer, clip=clip, objective=objective), max_graphs)

    def __call__(self, batch: Batch) -> torch.Tensor:
        return super().__call__(batch).clone()                             # a replay's buffer is rewritten next replay
