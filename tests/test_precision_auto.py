"""bf16 on the CPU: ``auto`` picks the dtype from the probe, and bf16 stays within its bounds.

Bounds: bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%). The fused encoder rounds
its operands and the results of its input-projection GEMMs; the recurrence and the gradients
sum in fp32. Outputs and gradients of the encoder are held to 2% relative error in norm, and a
bf16 run must differ from fp32 by more than 1e-4 (fp32 arithmetic differs by ~1e-7), which
proves that bf16 operands were really multiplied.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from iaa.jobs.modeling import precision_policy as precision
from iaa.jobs.config.job_config import ConfigError
from iaa.model import build_reader, nll_loss, preset
from iaa.model.kernels import gru_kernels
from iaa.model.kernels.deferred import Memory
from iaa.model.kernels.encoder_table import input_table
from iaa.model.kernels.fused_gru import fused_bigru
from iaa.model.kernels.precision import Layers, SmallMatmuls, amx_usable
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

REL = 2e-2
RAN_BF16 = 1e-4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# --- auto: the choice from the probe's result ---------------------------------------------------


@pytest.mark.parametrize("rates, chosen", [
    ({"fp32": 120.0, "bf16": 400.0}, "bf16"),      # AVX512-BF16 / AMX
    ({"fp32": 120.0, "bf16": 180.0}, "bf16"),      # exactly 1.5x
    ({"fp32": 120.0, "bf16": 170.0}, "fp32"),      # faster, but not enough to pay for the rounding
    ({"fp32": 120.0, "bf16": 15.0}, "fp32"),       # no bf16 units: emulated, slower
])
def test_auto_picks_the_dtype_from_the_probes_rates(rates, chosen) -> None:
    assert precision.resolve("auto", "cpu", rates=lambda: rates) == chosen
    for forced in ("fp32", "bf16"):                # forced either way, whatever the probe says
        assert precision.resolve(forced, "cpu", rates=lambda: rates) == forced


def test_unknown_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="train.precision"):
        precision.resolve("fp16", "cpu")
    with pytest.raises(ValueError, match="precision"):
        build_reader(preset("tiny", vocab_size=40), precision="auto")     # resolved before building


def test_probe_runs_once_per_machine_and_is_cached(tmp_path, monkeypatch) -> None:
    calls = []

    def measure():
        calls.append(1)
        return {"fp32": 100.0, "bf16": 350.0}

    assert precision.probed_rates(measure, tmp_path) == {"fp32": 100.0, "bf16": 350.0}
    assert precision.probed_rates(measure, tmp_path) == {"fp32": 100.0, "bf16": 350.0}
    assert len(calls) == 1
    saved = json.loads((tmp_path / precision.CACHE_FILE).read_text())
    assert saved[precision.machine_key()]["torch"] == torch.__version__
    monkeypatch.setattr(precision, "cpu_name", lambda: "another CPU")     # another machine: probe again
    assert precision.probed_rates(lambda: {"fp32": 100.0, "bf16": 90.0}, tmp_path)["bf16"] == 90.0
    assert len(json.loads((tmp_path / precision.CACHE_FILE).read_text())) == 2


def test_a_damaged_cache_is_measured_again(tmp_path) -> None:
    (tmp_path / precision.CACHE_FILE).write_text("{not json")
    assert precision.probed_rates(lambda: {"fp32": 1.0, "bf16": 2.0}, tmp_path) == {"fp32": 1.0, "bf16": 2.0}
    assert json.loads((tmp_path / precision.CACHE_FILE).read_text())[precision.machine_key()]["bf16"] == 2.0


def test_the_probe_measures_both_dtypes() -> None:
    rates = precision.measure_gemm_rates(shape=(64, 32, 48), reps=2)
    assert set(rates) == {"fp32", "bf16"} and all(r > 0 for r in rates.values())


def test_trainer_uses_and_reports_the_precision_auto_chose(monkeypatch, tmp_path) -> None:
    """The job resolves ``auto`` through the probe: bf16 from a bf16 machine's rates, fp32 from
    a machine without bf16 units (where fp32 is the same code as ``precision=fp32``)."""
    from iaa.jobs.config.job_config import JobConfig, TrainConfig
    from iaa.jobs.training.loop import Trainer

    class Session:
        device = torch.device("cpu")
        rank, world_size = 0, 1

        def latest_state(self):
            return None

        def prepare_model(self, model):
            return model

        def num_train_batches(self):
            return 1

    cfg = JobConfig(model=preset("tiny", vocab_size=40), train=TrainConfig(precision="auto"))
    for rates, chosen in (({"fp32": 100.0, "bf16": 400.0}, "bf16"), ({"fp32": 100.0, "bf16": 20.0}, "fp32")):
        monkeypatch.setattr(precision, "probed_rates", lambda rates=rates: rates)
        trainer = Trainer(cfg, Session(), show_progress=False)
        assert trainer.precision == trainer.model.precision == trainer.model.kernels.precision == chosen
    assert precision.resolved(cfg).train.precision == "fp32"


# --- bf16 results within bounds, and bf16 really ran ---------------------------------------------


def test_fused_encoder_in_bf16_stays_within_bf16_rounding_of_fp32() -> None:
    torch.manual_seed(0)
    gru = nn.GRU(64, 32, batch_first=True, bidirectional=True)
    lengths = torch.tensor([40, 17, 33, 40, 5, 28])
    x = torch.randn(6, 40, 64, requires_grad=True)
    weight = torch.randn(6, 40, 64)
    results = []
    for bf16 in (False, True):
        y = fused_bigru(x, lengths, gru._flat_weights, bf16=bf16, cpp=gru_kernels.load())
        grads = torch.autograd.grad((y * weight).sum(), [x, *gru.parameters()])
        assert y.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
        results.append((y, grads))
    (y32, g32), (y16, g16) = results
    assert torch.all(y16[torch.arange(40) >= lengths.unsqueeze(1)] == 0)        # padding exactly 0
    assert _rel(y16, y32) > RAN_BF16                                            # bf16 operands ran
    for a, b in zip((y16, *g16), (y32, *g32)):
        assert _rel(a, b) < REL


def test_bf16_is_the_argument_not_autocast_and_the_python_loop_agrees() -> None:
    """The fused encoder multiplies in bf16 where its ``bf16`` argument says so, whatever the
    caller's autocast; the C++ and the Python recurrence agree in it."""
    torch.manual_seed(1)
    gru = nn.GRU(16, 8, batch_first=True, bidirectional=True)
    x, lengths = torch.randn(4, 9, 16), torch.tensor([9, 3, 7, 1])
    cpp = gru_kernels.load()
    explicit = fused_bigru(x, lengths, gru._flat_weights, bf16=True, cpp=cpp)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = fused_bigru(x, lengths, gru._flat_weights, bf16=False, cpp=cpp)
    torch.testing.assert_close(under_autocast, fused_bigru(x, lengths, gru._flat_weights, cpp=cpp), atol=0, rtol=0)
    assert _rel(explicit, under_autocast) > RAN_BF16
    python = fused_bigru(x, lengths, gru._flat_weights, bf16=True, cpp=None)
    torch.testing.assert_close(python, explicit, atol=1e-6, rtol=1e-5)


def test_bf16_inference_table_is_half_the_memory_and_within_bf16_rounding() -> None:
    torch.manual_seed(2)
    gru = nn.GRU(24, 8, batch_first=True, bidirectional=True)
    embedding = torch.randn(50, 24)
    t32 = input_table(embedding, gru._flat_weights)
    t16 = input_table(embedding, gru._flat_weights, torch.bfloat16)
    assert t16.dtype == torch.bfloat16 and t16.shape == t32.shape
    assert t16.element_size() * 2 == t32.element_size()
    assert RAN_BF16 < _rel(t16.float(), t32) < 1e-2                            # one bf16 rounding


def test_memory_reads_multiply_in_bf16_and_return_fp32() -> None:
    torch.manual_seed(3)
    m = torch.randn(3, 20, 16, requires_grad=True)
    key, weights = torch.randn(3, 16), torch.softmax(torch.randn(3, 20), -1)
    for deferred in (True, False):
        mem = Memory(m, deferred=deferred, dtype=torch.bfloat16)
        assert mem.tensor.dtype == torch.bfloat16                              # cast once, here
        logits, glimpse = mem.logits(key), mem.glimpse(weights)
        assert logits.dtype == glimpse.dtype == torch.float32
        ref = Memory(m, deferred=deferred)
        assert RAN_BF16 < _rel(logits, ref.logits(key)) < REL
        assert RAN_BF16 < _rel(glimpse, ref.glimpse(weights)) < REL


@pytest.mark.parametrize("kind", ["iaa", "as-reader"])
def test_reader_training_and_inference_in_bf16_stay_within_bounds(kind) -> None:
    """The whole reader at the demo size, its weights scaled up so that attention is far from
    uniform: log-probabilities within 0.01, every parameter's gradient within 5% in norm, and
    bf16 really ran (the outputs differ by more than fp32 rounding)."""
    batch = random_batch([30, 45, 12, 38], [5, 7, 3, 6], vocab=60, seed=4)
    results = {}
    for used in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_reader(preset("demo", vocab_size=60, kind=kind, dropout=0.0), precision=used)
        with torch.no_grad():                    # attention far from uniform, as in test_precision.py
            for param in model.parameters():
                param.mul_(2.0)
        log_p = model(batch).log_probs
        nll_loss(log_p, batch.answer).backward()
        grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad) for n, p in model.named_parameters()}
        model.eval()
        with torch.inference_mode():
            inferred = model(batch).log_probs                                            # the inference table
        results[used] = (log_p.detach(), grads, inferred)
    (lp32, g32, i32), (lp16, g16, i16) = results["fp32"], results["bf16"]
    finite = torch.isfinite(lp32)
    assert lp16.dtype == i16.dtype == torch.float32
    assert torch.equal(finite, torch.isfinite(lp16)) and torch.equal(finite, torch.isfinite(i16))
    assert (lp16 - lp32)[finite].abs().max().item() > RAN_BF16                 # bf16 ran
    assert (lp16 - lp32)[finite].abs().max().item() < 0.01
    assert (i16 - i32)[finite].abs().max().item() < 0.01
    for name, grad in g32.items():
        assert _rel(g16[name], grad) < 0.05, name


def test_small_matmuls_in_bf16_inference_use_bf16_weights_made_once_per_pass() -> None:
    """In a bf16 inference block the T steps' layers multiply bf16 copies of their weights
    within bf16 bounds, one copy per block; the next block sees weights that a fused Adam step
    changed in place (it does not bump their version counter). With fp32 products they are the
    fp32 layers themselves."""
    torch.manual_seed(5)
    layer, cell = nn.Linear(96, 40), nn.GRUCell(48, 32)
    x, s = torch.randn(32, 96), torch.randn(32, 32)
    xc = torch.randn(32, 48)
    with torch.no_grad():
        with SmallMatmuls(gru_kernels.load(), bf16_products=False).block(grad=False) as layers:
            assert torch.equal(layers.linear(x, layer), layer(x))
            assert torch.equal(layers.gru_cell(xc, s, cell), cell(xc, s))
        with SmallMatmuls(gru_kernels.load()).block(grad=False) as layers:
            y16, h16 = layers.linear(x, layer), layers.gru_cell(xc, s, cell)
            copy = layers._bf16(layer.weight)
            assert copy.dtype == torch.bfloat16 and layers._bf16(layer.weight) is copy
    assert y16.dtype == h16.dtype == torch.float32
    for got, want in ((y16, layer(x)), (h16, cell(xc, s))):
        assert RAN_BF16 < _rel(got, want) < REL
    layer.weight.grad, layer.bias.grad = torch.ones_like(layer.weight), torch.ones_like(layer.bias)
    version = layer.weight._version
    torch.optim.Adam(layer.parameters(), lr=0.5, fused=True).step()             # in place, same version
    assert layer.weight._version == version
    with torch.no_grad(), SmallMatmuls(gru_kernels.load()).block(grad=False) as layers:
        updated = layers.linear(x, layer)
    assert _rel(updated, layer(x)) < REL and _rel(updated, y16) > 0.1


@pytest.mark.slow
def test_the_mlflow_run_records_the_precision_auto_chose(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.datasets import resolve
    from iaa.jobs.ports import TrainRun
    from iaa.jobs.train import train
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking.tracker import MlflowTracker
    from tests._tiny import TINY_SETS, make_tiny_prepared

    tiny = make_tiny_prepared(tmp_path / "tiny")
    cfg = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, "train.max_epochs=1"))
    assert cfg.train.precision == "auto"                                  # the default
    tracker = MlflowTracker(Workdir(tmp_path).tracking_uri(), MODEL_FILE)
    for rates, chosen in (({"fp32": 100.0, "bf16": 400.0}, "bf16"), ({"fp32": 100.0, "bf16": 20.0}, "fp32")):
        monkeypatch.setattr(precision, "probed_rates", lambda rates=rates: rates)
        result = train.run_tracked(TrainRun(cfg, tiny, tmp_path / f"run-{chosen}", show_progress=False), tracker)
        data = MlflowClient(result.tracking_uri).get_run(result.mlflow_run_id).data
        assert data.params["train.precision"] == chosen and result.precision == chosen == data.tags["precision"]


def test_auto_is_decided_once_here_for_cpus_and_for_gpus_this_process_sees(monkeypatch) -> None:
    """A driver without a GPU (a CPU head node) cannot tell whether the GPU workers run bf16: it
    leaves ``auto`` to each worker; for CPUs, or where it sees a GPU, it decides for them all."""
    from iaa.jobs.config.job_config import JobConfig, TrainConfig

    cfg = JobConfig(model=preset("tiny", vocab_size=40), train=TrainConfig(precision="auto"))
    monkeypatch.setattr(precision, "probed_rates", lambda: {"fp32": 100.0, "bf16": 400.0})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.resolved_once(cfg, gpus=False).train.precision == "bf16"        # this CPU's probe
    assert precision.resolved_once(cfg, gpus=True).train.precision == "auto"         # the workers' cards decide
    fixed = JobConfig(model=cfg.model, train=TrainConfig(precision="fp32"))
    assert precision.resolved_once(fixed, gpus=True).train.precision == "fp32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.resolved_once(cfg, gpus=True).train.precision == "bf16"         # this process's card


def test_a_checkpoint_config_with_the_former_bf16_switch_still_loads() -> None:
    """``model.bf16_projections`` is gone; a saved config that has it loads, and where it was on
    the run keeps asking for bf16."""
    from iaa.jobs.config.job_config import JobConfig, from_dict, to_dict

    for saved, expected in ((True, "bf16"), (False, "fp32")):
        data = to_dict(JobConfig())
        data["model"]["bf16_projections"] = saved
        data["train"]["precision"] = "fp32"
        cfg = from_dict(data)
        assert cfg.train.precision == expected and not hasattr(cfg.model, "bf16_projections")


def test_small_matmuls_in_bf16_training_multiply_on_amx_with_one_weight_gradient_per_block() -> None:
    """In a bf16 training block the T steps' layers multiply bf16 operands on AMX: outputs and
    every gradient within bf16 bounds of fp32 and further from it than fp32 rounding (AMX ran);
    the weight gradient summed over the block's uses matches."""
    cpp = gru_kernels.load()
    if not amx_usable(cpp):
        pytest.skip("this CPU has no AMX (or the OS does not grant it, or no C++ kernels): fp32 here")
    torch.manual_seed(6)
    layer, cell = nn.Linear(96, 64), nn.GRUCell(64, 32)
    xs = [torch.randn(20, 96, requires_grad=True) for _ in range(3)]          # 60 rows: padded to 64
    results = {}
    for amx in (False, True):
        for param in (*layer.parameters(), *cell.parameters()):
            param.grad = None
        layers = Layers(cpp if amx else None)
        h = torch.zeros(20, 32)
        for x in xs:
            h = layers.gru_cell(layers.linear(x, layer), h, cell)
        out = (h * torch.linspace(-1, 1, 32)).sum()
        grads = torch.autograd.grad(out, [*xs, *layer.parameters(), *cell.parameters()])
        results[amx] = (h.detach(), grads)
    (h32, g32), (h16, g16) = results[False], results[True]
    assert RAN_BF16 < _rel(h16, h32) < REL
    for got, want in zip(g16, g32):
        assert RAN_BF16 < _rel(got, want) < REL
