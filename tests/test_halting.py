"""Adaptive Computation Time over the inference steps (``model.halting``): halting="none" is the
paper's reader bit for bit, and "act" follows Graves's rule exactly."""

from __future__ import annotations

import pytest
import torch

from iaa.jobs.config.job_config import JobConfig, merge
from iaa.jobs.modeling.objective import Objective
from iaa.model import build_reader, candidate_probs, preset
from iaa.model.gates import gate_features
from iaa.model.halting import EPSILON
from iaa.model.masking import masked_log_softmax
from iaa.model.pointer import pointer_sum
from iaa.model.reader import Masks
from tests._model_inputs import one_thread, random_batch, select  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)


def act_reader(steps: int = 5, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_reader(preset("tiny", vocab_size=40, steps=steps, halting="act", **overrides))


def outputs(model, batch):
    """The reader's log P(a | Q, D) (B, C) and ACT's ``Halting``."""
    out = model(batch)
    return out.log_probs, out.halting


def spread_halting(model, bias: float = -1.0, scale: float = 100.0) -> None:
    """Halting weights large enough that examples stop at different steps."""
    with torch.no_grad():
        model.halting_unit.proj.weight.normal_(0.0, scale)
        model.halting_unit.bias.fill_(bias)


def paper_forward(model, batch):
    """The IAA reader's forward as it was before ``model.halting`` existed, line for line."""
    q_enc, _, d_enc = model._encode(batch)
    q_enc, d_enc = model._attention_inputs(q_enc, d_enc)
    s = q_enc.new_zeros(q_enc.shape[0], model.cfg.state_dim)
    for step in range(model.cfg.steps):
        q_t, _ = model.query_read(s, q_enc, batch.query_mask)
        if step == model.cfg.steps - 1:
            logits = model.doc_read.logits(s, q_t, d_enc)
            break
        d_t, _, _ = model.doc_read(s, q_t, d_enc, batch.doc_mask)
        features = model._drop(gate_features(s, q_t, d_t))
        r_q, r_d = model.gate_q(features), model.gate_d(features)
        s = model.search(torch.cat([r_q * q_t, r_d * d_t], -1), s)
    log_att = masked_log_softmax(logits, Masks.of(model.cfg, batch).answer)
    return pointer_sum(log_att, batch.doc_cand, batch.cand_mask.shape[1])


@pytest.mark.parametrize("kind", ["iaa", "iaa-fixed-query"])
def test_halting_none_is_the_paper_reader_bit_for_bit(kind):
    """Same parameters, same dropout draws: identical output and identical gradients."""
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, kind=kind, steps=3))
    assert model.cfg.halting == "none" and model.halting_unit is None
    batch = random_batch([5, 11, 3, 8], [4, 2, 6, 3])
    results = []
    for forward in (lambda b: model(b).log_probs, lambda b: paper_forward(model, b)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)                                   # the same dropout masks
        log_p = forward(batch)
        log_p[torch.isfinite(log_p)].sum().backward()
        grads = {n: p.grad.to_dense().clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((log_p.detach(), grads))
    (ours, our_grads), (paper, paper_grads) = results
    assert torch.equal(ours, paper)
    assert our_grads.keys() == paper_grads.keys()
    assert all(torch.equal(our_grads[n], paper_grads[n]) for n in our_grads)


def test_the_halting_unit_is_absent_from_a_none_reader_and_present_in_act():
    none = build_reader(preset("tiny", vocab_size=40))
    act = build_reader(preset("tiny", vocab_size=40, halting="act"))
    extra = set(act.state_dict()) - set(none.state_dict())
    assert extra == {"halting_unit.proj.weight", "halting_unit.bias"}


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("grad", [False, True])
def test_halting_driven_to_step_k_equals_a_fixed_reader_with_t_k(k, grad):
    """w = 0, b_t = -100 before k and +100 at k: every example stops at step k, and the answer
    is the fixed-T reader's d_{i,k} (with the same weights), in both the training-shaped loop
    (grad) and the inference loop that drops halted examples."""
    model = act_reader(steps=5).eval()
    with torch.no_grad():
        model.halting_unit.proj.weight.zero_()
        model.halting_unit.bias.copy_(torch.tensor([100.0 if t == k - 1 else -100.0 for t in range(4)]))
    fixed = build_reader(preset("tiny", vocab_size=40, steps=k)).eval()
    fixed.load_state_dict({n: v for n, v in model.state_dict().items() if not n.startswith("halting_unit")})
    batch = random_batch([5, 11, 3, 8], [4, 2, 6, 3])
    with torch.set_grad_enabled(grad):
        log_p, halting = outputs(model, batch)
        expected = fixed(batch).log_probs
    assert halting.steps.tolist() == [k] * 4
    torch.testing.assert_close(candidate_probs(log_p), candidate_probs(expected), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(log_p, expected, atol=1e-5, rtol=1e-5)


def reference_steps(probs: torch.Tensor, max_steps: int) -> list[int]:
    """N per example by Graves's rule, one example and one step at a time."""
    out = []
    for row in probs.tolist():
        total, n = 0.0, max_steps
        for t in range(max_steps - 1):
            total += row[t]
            if total >= 1.0 - EPSILON:
                n = t + 1
                break
        out.append(n)
    return out


@pytest.mark.parametrize("grad", [False, True])
def test_per_example_step_counts_and_weights_equal_a_plain_loop(grad):
    model = act_reader(steps=6).eval()
    spread_halting(model)
    batch = random_batch([5, 11, 3, 8, 9, 4, 12, 6], [4, 2, 6, 3, 5, 2, 4, 3], seed=3)
    with torch.set_grad_enabled(grad):
        _, halting = outputs(model, batch)
    steps = halting.steps.tolist()
    assert len(set(steps)) > 1, "the test needs examples that stop at different steps"
    assert steps == reference_steps(halting.probs.detach(), 6)
    for b, n in enumerate(steps):
        h = halting.probs[b].detach()
        expected = torch.cat([h[: n - 1], (1.0 - h[: n - 1].sum()).view(1), torch.zeros(halting.weights.shape[1] - n)])
        torch.testing.assert_close(halting.weights[b].detach(), expected)
        assert float(halting.remainder[b].detach()) == pytest.approx(float(expected[n - 1]))
    torch.testing.assert_close(halting.weights.sum(1).detach(), torch.ones(len(steps)))


def test_inference_drops_halted_examples_and_agrees_with_the_training_loop():
    model = act_reader(steps=6).eval()
    spread_halting(model)
    batch = random_batch([5, 11, 3, 8, 9, 4, 12, 6], [4, 2, 6, 3, 5, 2, 4, 3], seed=3)
    with torch.no_grad():
        fast, fast_halting = outputs(model, batch)
    slow, slow_halting = outputs(model, batch)             # grad on: every row every step
    torch.testing.assert_close(fast, slow.detach())
    assert torch.equal(fast_halting.steps, slow_halting.steps)


def test_act_padding_invariance():
    model = act_reader(steps=6).eval()
    spread_halting(model)
    batch = random_batch([5, 11, 3, 8], [4, 2, 6, 3], pad_to=(14, 7))
    with torch.no_grad():
        together, halting = outputs(model, batch)
        for i in range(4):
            alone, alone_halting = outputs(model, select(batch, i))
            torch.testing.assert_close(candidate_probs(together[i:i + 1]), candidate_probs(alone), atol=1e-5, rtol=1e-5)
            assert int(alone_halting.steps[0]) == int(halting.steps[i])


def test_every_act_parameter_gets_a_gradient_through_the_answer_and_the_ponder_cost():
    model = act_reader(steps=4, dropout=0.0, fused_gru=False)
    spread_halting(model, bias=-2.0, scale=0.5)
    batch = random_batch([5, 11, 3, 8], [4, 2, 6, 3])
    log_p, halting = outputs(model, batch)
    assert int(halting.steps.max()) == 4, "the test needs an example that reaches T_max"
    Objective(ponder_cost=0.01)(log_p, batch, halting).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad.to_dense() != 0)]
    assert missing == []


def test_ponder_cost_pushes_toward_fewer_steps():
    """The gradient of τ·(N + R) alone raises every halting probability before the stop."""
    model = act_reader(steps=4, dropout=0.0)
    spread_halting(model, bias=-2.0, scale=0.5)
    batch = random_batch([5, 11, 3, 8], [4, 2, 6, 3])
    _, halting = outputs(model, batch)
    halting.ponder.sum().backward()
    assert torch.all(model.halting_unit.bias.grad < 0)     # so descent raises b_t: halting comes sooner


def test_halting_config_is_checked_and_reaches_the_job_config():
    with pytest.raises(ValueError, match="halting must be one of"):
        preset("tiny", halting="sometimes")
    with pytest.raises(ValueError, match="iterative reader"):
        preset("tiny", kind="as-reader", halting="act")
    with pytest.raises(ValueError, match="ponder_cost"):
        preset("tiny", ponder_cost=-1.0)
    cfg = merge(JobConfig(), {"model": {"halting": "act", "ponder_cost": 0.01}})
    assert Objective.from_config(cfg).ponder_cost == 0.01
    cfg = preset("tiny", vocab_size=40, steps=4, halting="act", halt_bias_init=-2.5)
    assert torch.equal(build_reader(cfg).halting_unit.bias.detach(), torch.full((3,), -2.5))
    assert Objective.from_config(JobConfig()).ponder_cost == 0.0
