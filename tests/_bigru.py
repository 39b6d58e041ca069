"""A BiGRU kernel against ``nn.GRU(bidirectional=True)`` over ``pack_padded_sequence``: alone in
float64, and in a whole reader on CUDA in fp32."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from iaa.model import build_reader, nll_loss, preset
from iaa.model import kernels as fast
from iaa.model.encoder import BiGRUEncoder
from tests._model_inputs import random_batch

TOL = dict(atol=1e-10, rtol=1e-10)


def encoder(d: int = 5, h: int = 4, seed: int = 0) -> BiGRUEncoder:
    """A float64 encoder with non-zero biases and larger weights than the initial ones."""
    torch.manual_seed(seed)
    made = BiGRUEncoder(d, h).double()
    with torch.no_grad():
        for param in made.parameters():
            param.normal_(0.0, 0.5)
    return made


def packed(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The reference: ``gru`` over the packed rows, padded back to x's length with zeros."""
    sequences = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    return pad_packed_sequence(gru(sequences)[0], batch_first=True, total_length=x.shape[1])[0]


def states_final_grads(encoder: BiGRUEncoder, x: torch.Tensor, lengths: torch.Tensor, bigru, seed: int):
    """(B, L, 2h) states, (B, 2h) final states, and the gradients of x and every parameter under
    random upstream gradients of both."""
    x = x.detach().requires_grad_()
    states = bigru(encoder.gru, x, lengths)
    final = encoder.final(states, lengths)
    g = torch.Generator().manual_seed(seed)
    loss = (states * torch.randn(states.shape, generator=g, dtype=states.dtype)).sum() \
        + (final * torch.randn(final.shape, generator=g, dtype=final.dtype)).sum()
    grads = torch.autograd.grad(loss, [x, *encoder.parameters()])
    return states.detach(), final.detach(), grads


def assert_equals_packed(bigru, lengths: list[int], max_len: int, h: int = 4, d: int = 5) -> None:
    """``bigru(gru, x, lengths)`` equals the packed reference within ``TOL``: states, final states
    and the gradients of x and all eight parameters, each exercised; padding exactly 0."""
    made = encoder(d, h)
    lengths_t = torch.tensor(lengths)
    x = torch.randn(len(lengths), max_len, d, dtype=torch.float64)
    want = states_final_grads(made, x, lengths_t, packed, seed=1)
    got = states_final_grads(made, x, lengths_t, bigru, seed=1)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    names = ["x", *(name for name, _ in made.named_parameters())]
    assert len(got[2]) == len(names) == 9
    for name, a, b in zip(names, got[2], want[2]):
        torch.testing.assert_close(a, b, **TOL, msg=name)
        assert b.abs().sum() > 0 or (max(lengths) == 1 and "weight_hh" in name), name  # exercised (W_hh: h_0 = 0)
    padding = torch.arange(max_len) >= lengths_t.unsqueeze(1)
    assert torch.all(got[0][padding] == 0)                       # exactly 0, as pad_packed_sequence's


def assert_cuda_reader_equals_packed(kernel: type, **switches: bool) -> None:
    """On CUDA in fp32 (TF32 off): a tiny reader whose config has ``switches`` runs ``kernel`` as
    its encoder; its log-probabilities and every gradient, at its first and second call, equal
    those of the same reader with ``nn.GRU`` over packed sequences."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        cfg = preset("tiny", vocab_size=60, steps=3, dropout=0.0, hidden_dim=32, embed_dim=32, **switches)
        batch = random_batch([40, 25, 9, 33, 1, 40], [5, 7, 3, 6, 1, 9], vocab=60, seed=4).to("cuda")
        torch.manual_seed(0)
        model = build_reader(cfg, "cuda", "fp32").to("cuda")
        assert isinstance(model.kernels.encoder, kernel)
        reference = copy.deepcopy(model)
        reference.kernels = fast.select("cuda", "fp32", dataclasses.replace(cfg, fused_gru=False, triton_gru=False))
        assert reference.kernels.encoder is None
        results = []
        for reader in (model, reference, model):                 # the kernel's second call too
            reader.zero_grad(set_to_none=True)
            log_p = reader(batch).log_probs
            nll_loss(log_p, batch.answer).backward()
            torch.cuda.synchronize()
            results.append((log_p.detach().cpu(), {n: p.grad.to_dense().cpu() for n, p in reader.named_parameters()}))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    for (lp, grads) in (results[0], results[2]):
        torch.testing.assert_close(lp, results[1][0], atol=1e-5, rtol=1e-4)
        for name, grad in results[1][1].items():
            torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
