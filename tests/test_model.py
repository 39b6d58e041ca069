"""Properties of the readers: masking, padding invariance, gradients, pointer-sum, the equations."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from iaa.model import (MODEL_KINDS, ReaderConfig, build_reader, candidate_probs, masked_log_softmax,
                       masked_softmax, nll_loss, pointer_sum, preset)
from iaa.model import kernels as fast
from tests._model_inputs import one_thread, random_batch, select  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)


def pointer_sum_loop(log_att: torch.Tensor, doc_cand: torch.Tensor, num_cands: int) -> torch.Tensor:
    """Plain-loop reference of ``pointer_sum``: P(a) = Σ over positions, then log."""
    probs = log_att.exp()
    out = torch.zeros(log_att.shape[0], num_cands, dtype=log_att.dtype)
    for b in range(log_att.shape[0]):
        for i in range(log_att.shape[1]):
            a = int(doc_cand[b, i])
            if a >= 0:
                out[b, a] += probs[b, i]
    return out.log()


def tiny(kind: str = "iaa", **overrides):
    torch.manual_seed(0)
    return build_reader(preset("tiny", vocab_size=40, kind=kind, **overrides))


def test_masked_softmax_zero_on_pads_and_sums_to_one():
    logits = torch.randn(3, 6) * 30
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0], [1] * 6], dtype=torch.bool)
    probs = masked_softmax(logits, mask)
    assert torch.all(probs[~mask] == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    log_probs = masked_log_softmax(logits, mask)
    assert torch.all(log_probs[~mask] == float("-inf"))
    torch.testing.assert_close(log_probs[mask].exp(), probs[mask])


def test_masked_softmax_fully_masked_row_is_zero_not_nan():
    logits = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    probs = masked_softmax(logits, mask)
    log_probs = masked_log_softmax(logits, mask)
    assert torch.all(probs[0] == 0) and torch.all(log_probs[0] == float("-inf"))
    (probs[1].sum() + log_probs[1, :2].sum()).backward()
    assert torch.isfinite(logits.grad).all() and torch.all(logits.grad[0] == 0)


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("fast", [True, False])
def test_padding_invariance(kind, fast):
    flags = dict(fused_gru=fast, batched_read_grad=fast)
    model = tiny(kind, **flags).eval()
    batch = random_batch([5, 11, 3, 8], [4, 2, 6, 3], pad_to=(14, 7))
    with torch.no_grad():
        together = candidate_probs(model(batch).log_probs)
        for b in range(4):
            alone = candidate_probs(model(select(batch, b)).log_probs)
            torch.testing.assert_close(alone[0], together[b], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_parameter_gets_a_gradient(kind):
    # T = 3: with s_0 = 0 the inference GRU's recurrent weights first matter at s_2, read at t = 3.
    model = tiny(kind, dropout=0.0, steps=3)
    batch = random_batch([9, 12, 7], [4, 5, 3])
    nll_loss(model(batch).log_probs, batch.answer).backward()
    for name, param in model.named_parameters():
        grad = param.grad.to_dense() if param.grad.is_sparse else param.grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_overfits_one_small_batch(kind):
    from iaa.jobs.training.step import build_optimizer, train_step

    model = tiny(kind, dropout=0.0)
    batch = random_batch([10, 14, 8, 12], [4, 5, 3, 6], seed=3)
    optimizer = build_optimizer(model, lr=0.02, embed_l2=0.0)
    for _ in range(150):
        loss = float(train_step(model, optimizer, batch))
    model.eval()
    with torch.no_grad():
        log_p = model(batch).log_probs
    assert loss < 0.1
    assert torch.equal(log_p.argmax(1), batch.answer)


def test_pointer_sum_equals_plain_loop():
    torch.manual_seed(0)
    logits = torch.randn(4, 30, dtype=torch.float64) * 5
    mask = torch.arange(30) < torch.tensor([30, 17, 5, 22]).unsqueeze(1)
    doc_cand = torch.randint(-1, 6, (4, 30)).masked_fill(~mask, -1)
    log_att = masked_log_softmax(logits, mask)
    torch.testing.assert_close(pointer_sum(log_att, doc_cand, 6), pointer_sum_loop(log_att, doc_cand, 6))


def test_pointer_sum_stays_finite_where_probabilities_underflow():
    logits = torch.tensor([[0.0, -200.0, -300.0]], requires_grad=True)
    log_p = pointer_sum(masked_log_softmax(logits, torch.ones(1, 3, dtype=torch.bool)),
                        torch.tensor([[0, 1, 2]]), 3)
    assert torch.isfinite(log_p).all()
    torch.testing.assert_close(log_p.detach(), torch.tensor([[0.0, -200.0, -300.0]]))
    nll_loss(log_p, torch.tensor([2])).backward()
    assert torch.isfinite(logits.grad).all()


def test_absent_candidate_gets_zero_probability_not_nan():
    logits = torch.randn(2, 6, requires_grad=True)
    doc_cand = torch.tensor([[0, 0, 2, -1, 2, 0], [1, -1, -1, -1, -1, -1]])
    log_p = pointer_sum(masked_log_softmax(logits, torch.ones(2, 6, dtype=torch.bool)), doc_cand, 4)
    assert log_p[0, 1] == float("-inf") and log_p[0, 3] == float("-inf")
    probs = candidate_probs(log_p)
    assert probs[0, 1] == 0 and probs[0, 3] == 0 and probs[1, 0] == 0
    torch.testing.assert_close(probs.sum(1), torch.ones(2))
    nll_loss(log_p, torch.tensor([2, 1])).backward()
    assert torch.isfinite(logits.grad).all()
    assert not torch.isnan(candidate_probs(torch.full((1, 3), float("-inf")))).any()


def test_nll_loss_leaves_out_answers_absent_from_the_document():
    log_p = torch.tensor([[-0.5, float("-inf")], [-1.0, -2.0]], requires_grad=True)
    loss = nll_loss(log_p, torch.tensor([1, 0]))
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert torch.isfinite(log_p.grad).all()


def test_candidate_softmax_restricts_attention_to_candidates():
    model = tiny("iaa", candidate_softmax=True).eval()
    batch = random_batch([9, 12], [4, 5])
    with torch.no_grad():
        total = model(batch).log_probs.exp().sum(1)
    torch.testing.assert_close(total, torch.ones(2))       # all mass on candidate positions
    plain = tiny("iaa").eval()
    with torch.no_grad():
        assert torch.all(plain(batch).log_probs.exp().sum(1) < 1)


def test_init_statistics():
    torch.manual_seed(0)
    model = build_reader(preset("demo", vocab_size=2000))
    std = model.embedding.weight.std().item()
    assert std == pytest.approx(0.05, rel=0.02)
    for name, param in model.named_parameters():
        if "bias" in name:
            assert torch.all(param == 0), name
        elif "weight_hh" in name:
            hidden = param.shape[1]
            for block in param.detach().split(hidden, 0):
                torch.testing.assert_close(block @ block.T, torch.eye(hidden), atol=1e-5, rtol=0)
        elif param.numel() > 2000:
            assert param.std().item() == pytest.approx(0.05, rel=0.1), name


def _gru_step(x, h, w_ih, w_hh, b_ih, b_hh):
    """Eq. 1, in PyTorch's gate order and placement of the reset gate (see encoder.py)."""
    (i_r, i_z, i_n), (h_r, h_z, h_n) = (w_ih @ x + b_ih).chunk(3), (w_hh @ h + b_hh).chunk(3)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def _encode(gru, xs):
    """x̃_i = [→h_i, ←h_i] by a plain loop over tokens."""
    weights = [p.double() for p in gru._flat_weights]
    hidden = gru.hidden_size
    fwd, bwd, h = [], [], torch.zeros(hidden, dtype=torch.float64)
    for x in xs:
        h = _gru_step(x, h, *weights[:4])
        fwd.append(h)
    h = torch.zeros(hidden, dtype=torch.float64)
    for x in reversed(xs):
        h = _gru_step(x, h, *weights[4:])
        bwd.insert(0, h)
    return [torch.cat([f, b]) for f, b in zip(fwd, bwd)]


def _softmax(scores):
    e = [torch.exp(v - max(scores)) for v in scores]
    return [v / sum(e) for v in e]


def test_inference_steps_equal_a_transcription_of_the_equations():
    """T = 2: one full inference step (reads, gates, GRU update) and the final answer read."""
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, steps=2, dropout=0.0)).double().eval()
    batch = random_batch([7], [3], seed=5)
    p = {k: v.detach() for k, v in model.named_parameters()}
    emb = p["encoders.embedding.weight"]
    q = _encode(model.encoders.query_encoder.gru, [emb[w] for w in batch.query[0]])
    d = _encode(model.encoders.doc_encoder.gru, [emb[w] for w in batch.doc[0]])
    s = torch.zeros(model.cfg.state_dim, dtype=torch.float64)                      # s_0
    for step in range(2):
        key_q = p["query_read.proj.weight"] @ s + p["query_read.proj.bias"]        # A_q s + a_q
        q_att = _softmax([qi @ key_q for qi in q])
        q_t = sum(a * qi for a, qi in zip(q_att, q))
        key_d = p["doc_read.proj.weight"] @ torch.cat([s, q_t]) + p["doc_read.proj.bias"]
        d_att = _softmax([di @ key_d for di in d])
        d_t = sum(a * di for a, di in zip(d_att, d))
        x = torch.cat([s, q_t, d_t, q_t * d_t])
        r_q, r_d = (torch.sigmoid(p[f"{g}.out.weight"] @ torch.tanh(p[f"{g}.hidden.weight"] @ x + p[f"{g}.hidden.bias"])
                                  + p[f"{g}.out.bias"]) for g in ("gate_q", "gate_d"))
        s = _gru_step(torch.cat([r_q * q_t, r_d * d_t]), s, p["search.weight_ih"], p["search.weight_hh"],
                      p["search.bias_ih"], p["search.bias_hh"])
    expected = torch.zeros(4, dtype=torch.float64)
    for i, a in enumerate(batch.doc_cand[0].tolist()):
        if a >= 0:
            expected[a] += d_att[i]                                              # eq. 2
    with torch.no_grad():
        got = model(batch).log_probs[0].exp()
    torch.testing.assert_close(got, expected)


def test_the_model_package_imports_only_torch_itself_and_the_standard_library():
    """And Triton, in the Triton kernel's two modules only (an optional extra)."""
    import ast
    import sys
    from pathlib import Path

    import iaa.model

    outside = []
    for path in sorted(Path(iaa.model.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                triton_kernel = top == "triton" and path.name in ("triton_gru.py", "triton_recurrence.py")
                if not (top == "torch" or name.startswith("iaa.model") or top in sys.stdlib_module_names
                        or triton_kernel):
                    outside.append(f"{path.name}: {name}")
    assert outside == []


SAVED = Path(__file__).parent / "data" / "readers_before_kernel_seam.pt"


def _unflatten(flat: dict) -> dict[str, torch.Tensor]:
    sizes = [math.prod(shape) for shape in flat["shapes"]]
    return {name: values.view(shape) for name, shape, values
            in zip(flat["names"], flat["shapes"], flat["values"].split(sizes))}


@pytest.mark.parametrize("variant", ["iaa", "iaa-fixed-query", "as-reader", "iaa-act"])
@pytest.mark.parametrize("kernels", ["selected", "reference"])
def test_a_reader_saved_by_an_earlier_version_loads_and_answers_the_same(variant, kernels):
    """``tests/data/readers_before_kernel_seam.pt``: each variant's config, state dict and
    outputs on one batch (inference, and training with every parameter's gradient), saved by the
    code before the fast paths moved behind ``iaa.model.kernels.select``, on its default (fast)
    path. Its parameter names load as they are; the default kernels give the same numbers to
    fp32 rounding, and the reference the same within 1e-5."""
    saved = torch.load(SAVED, weights_only=True)[variant]
    cfg = ReaderConfig(**saved["config"])
    model = build_reader(cfg)
    if kernels == "reference":
        model.kernels = fast.select("cpu", "fp32", replace(cfg, fused_gru=False, batched_read_grad=False,
                                                           fast_dropout=False, inference_table=False))
    model.load_state_dict(_unflatten(saved["state_dict"]))                   # strict: same names
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=1)
    model.eval()
    with torch.no_grad():
        inferred = model(batch).log_probs
    model.train()
    log_p = model(batch).log_probs
    nll_loss(log_p, batch.answer).backward()
    tol = dict(atol=1e-6, rtol=1e-6) if kernels == "selected" else dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(inferred, saved["log_p"], **tol)
    torch.testing.assert_close(log_p.detach(), saved["train_log_p"], **tol)
    for name, grad in _unflatten(saved["grads"]).items():
        param = dict(model.named_parameters())[name]
        torch.testing.assert_close(param.grad.to_dense() if param.grad.is_sparse else param.grad, grad, **tol,
                                   msg=name)
