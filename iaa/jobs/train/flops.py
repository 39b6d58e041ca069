"""Matrix-multiply FLOPs of a reader's training step, counted from the config and the batch shape.

``torch.utils.flop_counter.FlopCounterMode`` sees only the matmuls that reach the dispatcher:
on CUDA it misses cuDNN's GRU (``_cudnn_rnn`` and its backward, ~90% of the work at the paper's
size), and on the fused CPU path the C++ recurrence. This counts what the step computes, whatever
the kernels: 2 FLOPs per multiply-add, forward and backward (a matmul's backward is two matmuls
of the same size, one when its input needs no gradient), as ``FlopCounterMode`` counts them on
the reference CPU path (``fused_gru=False``, ``batched_read_grad=False``), where every matmul is
dispatched.

What is counted:

- encoders (eq. 1), per real token and direction: the input projection 3h x d and the recurrent
  matrix 3h x h. Each direction's first step multiplies a zero state (no gradient flows to it):
  all rows for the forward GRU, the rows as long as the longest for the backward one;
- IAA steps (section 3), per example and per padded position: query read (A_q, the logits over
  Lq and the glimpse), document read (A_d, the logits over Ld and the glimpse), two search gates
  and the inference GRU; the last step computes the query read and the document logits only;
  s_0 = 0 needs no gradient;
- the fixed-query ablation: the query's mean instead of the query read (no A_q);
- ACT: every example runs T_max steps (an upper bound: training stops when the last example of
  the batch halts), plus the halting unit w · s_t after each step but the last;
- AS Reader: one dot product per document position.

Each kind of reader (``model.kind``) and halting rule (``model.halting``) is counted as its
config says; one this module does not know is an error, never counted as another.
"""

from __future__ import annotations

from typing import Sequence

from iaa.model.config import MODEL_KINDS as KINDS, ReaderConfig

GRU_GATES = 3                       # r, z, n: the rows of W_ih and W_hh are 3h (PyTorch's GRU, eq. 1)
HALTING = ("none", "act")


def check_counted(cfg: ReaderConfig) -> None:
    """Raise ValueError unless this module counts ``cfg``'s reader."""
    if cfg.kind not in KINDS:
        raise ValueError(f"FLOPs of model.kind={cfg.kind!r} are not counted (known: {', '.join(KINDS)})")
    if cfg.halting not in HALTING:
        raise ValueError(f"FLOPs of model.halting={cfg.halting!r} are not counted (known: {', '.join(HALTING)})")


def _matmul(m: int, k: int, n: int, input_grad: bool = True) -> int:
    """Forward and backward FLOPs of (m x k) @ (k x n) whose right factor is a parameter."""
    return 2 * m * k * n * (3 if input_grad else 2)


def encoder_flops(cfg: ReaderConfig, tokens: int, rows: int, longest: int) -> int:
    """One BiGRU over ``tokens`` real tokens in ``rows`` sequences (``longest`` of them of the
    maximum length), forward and backward."""
    d, h = cfg.embed_dim, cfg.hidden_dim
    inputs = 2 * _matmul(tokens, d, GRU_GATES * h)                        # both directions
    return inputs + recurrent_flops(cfg, tokens, rows, longest)


def recurrent_flops(cfg: ReaderConfig, tokens: int, rows: int, longest: int) -> int:
    """The recurrent matmuls h_{t-1} W_hh^T of one BiGRU (part of ``encoder_flops``)."""
    h = cfg.hidden_dim
    zero_states = 2 * (rows + longest) * h * GRU_GATES * h         # no input gradient at step 0
    return 2 * _matmul(tokens, h, GRU_GATES * h) - zero_states


def read_flops(cfg: ReaderConfig, batch: int, query_len: int, doc_len: int) -> int:
    """The attention steps of one padded batch (B, Lq, Ld), forward and backward."""
    return _read_flops(cfg, batch, query_len, doc_len, reads=True, layers=True)


def step_layer_flops(cfg: ReaderConfig, batch: int) -> int:
    """The matmuls of the attention steps with a weight matrix (read projections, gates, the
    inference GRU) in one batch of ``batch`` rows: part of ``read_flops``."""
    return _read_flops(cfg, batch, 0, 0, reads=False, layers=True)


def _read_flops(cfg: ReaderConfig, batch: int, query_len: int, doc_len: int, reads: bool, layers: bool) -> int:
    check_counted(cfg)
    two_h, s, g, steps = 2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim, cfg.steps
    bmm = lambda length, grads: 2 * batch * length * two_h * grads * reads  # noqa: E731 (one read)
    dense = lambda *args: _matmul(*args) * layers                          # noqa: E731
    if cfg.kind == "as-reader":
        return bmm(doc_len, 3)                                      # logits d̃ q
    total = 0
    for step in range(steps):
        s_grad = step > 0                                           # s_0 = 0 has no gradient
        if cfg.kind == "iaa":
            total += dense(batch, s, two_h, s_grad)                 # A_q s + a_q
            total += bmm(query_len, 3) + bmm(query_len, 3)          # logits, glimpse
        elif cfg.kind == "iaa-fixed-query":                         # the mean
            total += bmm(query_len, 2)                              # the weights need no gradient
        total += dense(batch, s + two_h, two_h)                     # A_d [s, q_t] + a_d
        total += bmm(doc_len, 3)                                    # logits
        if step == steps - 1:
            break
        total += bmm(doc_len, 3)                                    # glimpse
        total += 2 * (dense(batch, s + 3 * two_h, g) + dense(batch, g, two_h))  # gates g_q, g_d
        total += dense(batch, 2 * two_h, GRU_GATES * s) + dense(batch, s, GRU_GATES * s, s_grad)  # GRUCell
        if cfg.halting == "act":
            total += dense(batch, s, 1)                             # h_t = σ(w · s_t + b_t)
    return total


def train_step_flops(cfg: ReaderConfig, query_lengths: Sequence[int], doc_lengths: Sequence[int],
                     query_len: int | None = None, doc_len: int | None = None) -> int:
    """FLOPs of one training step (forward and backward) of a padded batch.

    Args:
        cfg: the reader.
        query_lengths, doc_lengths: each example's real tokens (B of each).
        query_len, doc_len: the padded widths Lq and Ld (default: the longest lengths).
    """
    check_counted(cfg)
    lq, ld = query_len or max(query_lengths), doc_len or max(doc_lengths)
    return (_encoder(cfg, query_lengths) + _encoder(cfg, doc_lengths)
            + read_flops(cfg, len(doc_lengths), lq, ld))


def _encoder(cfg: ReaderConfig, lengths: Sequence[int]) -> int:
    longest = max(lengths)
    return encoder_flops(cfg, sum(lengths), len(lengths), sum(1 for n in lengths if n == longest))


def batch_recurrent_flops(cfg: ReaderConfig, batch) -> int:
    """``recurrent_flops`` of both encoders of a ``ReaderInputs`` batch."""
    total = 0
    for mask in (batch.query_mask, batch.doc_mask):
        lengths = mask.sum(1).tolist()
        total += recurrent_flops(cfg, sum(lengths), len(lengths), lengths.count(max(lengths)))
    return total


def batch_flops(cfg: ReaderConfig, batch) -> int:
    """``train_step_flops`` of a ``ReaderInputs`` batch (from the masks' row sums)."""
    return train_step_flops(cfg, batch.query_mask.sum(1).tolist(), batch.doc_mask.sum(1).tolist(),
                            batch.query_mask.shape[1], batch.doc_mask.shape[1])
