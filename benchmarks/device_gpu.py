"""The steps of ``device_run.py`` that measure a training step's speed: ``gate`` (the document
BiGRU: padded or packed, eager or captured, on 1, 2 or 4 streams) and ``bench`` (eager and
captured steps, with the kernel launches of each).

Each step runs in its own process, as those of ``device_steps.py``, and returns one dict.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace

import device_steps as steps
from device_steps import COMPARE_BATCH, partial, say

GATE_BATCHES = (8, 16, 32)
GATE_US_PER_TIME_STEP = 7.0     # forward+backward of the document BiGRU at B=16 above this: write our own
GATE_OVERLAP_4 = 3.0            # ... or 4 streams overlapping less than this
CAPTURED_SHAPES = 3             # bench: the most common bucket shapes, each captured once


class PaddedLoop:
    """A BiGRU over padded sequences with ``nn.GRU``'s weights, one masked cell step per position:
    no host lengths, so it can be captured. The stand-in where no padded kernel is selected."""

    capturable = True

    def encode(self, x, lengths, gru):
        import torch

        batch, width = x.shape[:2]
        mask = (torch.arange(width, device=x.device) < lengths[:, None]).unsqueeze(-1)   # (B, L, 1)
        directions = []
        for suffix, order in (("", range(width)), ("_reverse", range(width - 1, -1, -1))):
            weights = [getattr(gru, f"{n}_l0{suffix}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            h, states = x.new_zeros(batch, gru.hidden_size), [None] * width
            for t in order:
                h = torch.where(mask[:, t], torch.gru_cell(x[:, t], h, *weights), h)
                states[t] = h * mask[:, t]
            directions.append(torch.stack(states, 1))
        return torch.cat(directions, -1)                                   # (B, L, 2h)


def _padded_encoder(device: str):
    """(name, kernel): the encoder kernel selected on ``device`` where it is capturable, else ``PaddedLoop``."""
    from iaa.model import kernels
    from iaa.model.config import PRESETS

    chosen = kernels.select(device, "fp32", replace(PRESETS["paper"], vocab_size=16)).encoder
    if getattr(chosen, "capturable", False):
        return type(chosen).__name__, chosen
    return "PaddedLoop (stand-in)", PaddedLoop()


def _triton_encoder(device: str):
    """(``TritonGRU``, None) where it can run on ``device``, else (None, why not)."""
    from iaa.model.kernels.triton_gru import TritonGRU, triton_missing

    if device != "cuda":
        return None, "runs on CUDA only"
    why = triton_missing()
    return (None, why) if why else (TritonGRU(), None)


def _seconds_per_call(fn, device: str, budget_s: float = 0.3, most: int = 20) -> float:
    """Mean seconds of ``fn()`` after one warm-up call, over up to ``most`` calls or ``budget_s``."""
    fn()
    steps._sync(device)
    start, calls = time.perf_counter(), 0
    while calls < most and (calls < 2 or time.perf_counter() - start < budget_s):
        fn()
        calls += 1
    steps._sync(device)
    return (time.perf_counter() - start) / calls


class _Replay:
    """A captured graph's replay that holds the captured callable, and so every tensor it closes
    over, alive as long as the graph.

    A graph reads and writes the memory of the tensors it captured (inputs, parameters,
    gradients) at fixed addresses. A tensor freed after capture gives its block back to the
    caching allocator: another tensor may take it (silently wrong results), or ``empty_cache``,
    which each ``torch.cuda.graph`` runs on entry, hands it back to the driver, and the next
    replay reads freed memory (an illegal memory access)."""

    def __init__(self, graph, fn) -> None:
        self.graph, self.fn = graph, fn

    def __call__(self) -> None:
        self.graph.replay()


def _graphed(fn) -> _Replay:
    """``fn`` (no arguments) captured in a CUDA graph after a warm-up on a side stream: its
    replay, which keeps ``fn`` alive as long as the graph."""
    import torch

    side, current = torch.cuda.Stream(), torch.cuda.current_stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _Replay(graph, fn)


def _encoder_pass(batch: int, length: int, dim: int, hidden: int, device: str, kernel=None):
    """One document encoder's forward+backward on random input (packed ``nn.GRU`` without ``kernel``)."""
    import torch

    from iaa.model.encoder import BiGRUEncoder

    encoder = BiGRUEncoder(dim, hidden).to(device)
    encode = None if kernel is None else kernel.encode                    # the reader's encoder slot
    x = torch.randn(batch, length, dim, device=device)
    lengths = torch.randint(length // 2, length + 1, (batch,))
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).to(device)
    params = list(encoder.parameters())

    def run() -> None:
        for p in params:
            p.grad = None
        states, final = encoder(x, mask, lengths, "fp32", encode)
        (states.sum() + final.sum()).backward()
    return run


def _overlap(make, n: int, device: str) -> float:
    """n independent captured passes on n streams: n x (one alone) / (n together).

    Each graph has its own private memory pool (none is shared), so replays on several streams
    at once never hand each other's intermediates the same memory."""
    import torch

    replays = [_graphed(make()) for _ in range(n)]
    streams = [torch.cuda.Stream() for _ in range(n)]
    current = torch.cuda.current_stream()

    def together() -> None:
        for replay, stream in zip(replays, streams):
            stream.wait_stream(current)                                    # after the previous call's work
            with torch.cuda.stream(stream):
                replay()
        for stream in streams:
            current.wait_stream(stream)
    return n * _seconds_per_call(replays[0], device) / _seconds_per_call(together, device)


def step_gate_overlap(args) -> dict:
    """The overlap of 2 and 4 streams of captured document-encoder passes at B=16 (``gate``
    runs it in a process of its own, so that a fault there leaves the gate's figures intact)."""
    length, dim, hidden = (32, 16, 8) if args.tiny else (512, 384, 128)
    _, kernel = _padded_encoder(args.device)
    out: dict = {}
    for n in (2, 4):
        out[f"streams_{n}"] = round(_overlap(
            lambda: _encoder_pass(16, length, dim, hidden, args.device, kernel), n, args.device), 3)
        partial(out)
    return out


def _overlap_in_child(args, limit_s: float) -> tuple[dict, str | None]:
    """``step_gate_overlap`` in a child process: ({"streams_2": x, "streams_4": y}, None), or
    what it measured before failing and why it failed."""
    cmd = steps._self(args, "gate_overlap")
    try:
        proc = subprocess.run(cmd, cwd=steps.ROOT, capture_output=True, text=True, timeout=max(limit_s, 5.0))
    except subprocess.TimeoutExpired as err:
        stdout = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return _last_json(stdout), f"timed out after {max(limit_s, 5.0):.0f} s"
    found = _last_json(proc.stdout)
    if proc.returncode != 0 or "streams_4" not in found:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        why = next((line for line in tail if "Error" in line), tail[-1] if tail else "")
        return found, f"exit {proc.returncode}: {why.strip()[:300]}"
    return found, None


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


def step_gate(args) -> dict:
    """Microseconds per time step of the document BiGRU's forward+backward at B = 8, 16, 32:
    packed (cuDNN), padded, and our own Triton GRU where Triton is installed, eager and captured;
    and the overlap of 1, 2, 4 streams at B=16. ``gate_passed``: cuDNN's best is not enough (see
    ``GATE_*``); ``triton_speedup_b16``: cuDNN's best over the Triton GRU's at B=16."""
    length, dim, hidden = (32, 16, 8) if args.tiny else (512, 384, 128)
    started, cuda = time.perf_counter(), args.device == "cuda"
    name, kernel = _padded_encoder(args.device)
    triton, triton_missing = _triton_encoder(args.device)
    out: dict = {"padded_encoder": name, "length": length, "embed_dim": dim, "hidden_dim": hidden, "us_per_time_step": {},
                 "triton_encoder": "TritonGRU" if triton else f"not run: {triton_missing}"}
    per_step = lambda seconds: round(seconds * 1e6 / length, 3)            # noqa: E731
    for b in GATE_BATCHES:
        row = out["us_per_time_step"][f"b{b}"] = {}
        row["packed_eager"] = per_step(_seconds_per_call(_encoder_pass(b, length, dim, hidden, args.device), args.device))
        padded = _encoder_pass(b, length, dim, hidden, args.device, kernel)
        row["padded_eager"] = per_step(_seconds_per_call(padded, args.device))
        row["padded_captured"] = per_step(_seconds_per_call(_graphed(padded), args.device)) if cuda else None
        if triton is not None:
            try:
                own = _encoder_pass(b, length, dim, hidden, args.device, triton)
                row["triton_eager"] = per_step(_seconds_per_call(own, args.device))
                row["triton_captured"] = per_step(_seconds_per_call(_graphed(own), args.device)) if cuda else None
            except Exception as error:  # noqa: BLE001 - a figure of the gate, not the end of it
                out["triton_error"], triton = f"{type(error).__name__}: {error}"[:500], None
                say(f"gate: the Triton GRU failed ({out['triton_error']}); cuDNN's figures stand")
        say(f"gate B={b}: µs per time step {row}")
        partial(out)
    b16 = out["us_per_time_step"]["b16"]
    best = min(v for v in (b16["packed_eager"], b16["padded_eager"], b16["padded_captured"]) if v is not None)
    own_best = [v for v in (b16.get("triton_eager"), b16.get("triton_captured")) if v is not None]
    if own_best:                           # above 1: our own Triton GRU beats cuDNN's best at B=16
        out["triton_speedup_b16"] = round(best / min(own_best), 3)
    out["gate_rule"] = f"forward+backward > {GATE_US_PER_TIME_STEP} µs per time step at B=16, or 4 streams overlap < {GATE_OVERLAP_4}x"
    _gate(out, best, None)
    partial(out)                                                       # the figures, whatever follows
    out["overlap_b16"] = {"streams_1": 1.0, "streams_2": None, "streams_4": None}
    if cuda:
        measured, failed = _overlap_in_child(args, args.seconds - (time.perf_counter() - started) - 5)
        out["overlap_b16"].update(measured)
        if failed is not None:
            out["overlap_error"] = failed
            say(f"gate: the overlap measurement failed ({failed}); the gate stands on the per-step figures")
    _gate(out, best, out["overlap_b16"]["streams_4"])
    say(f"gate: best {best} µs per time step at B=16, 4-stream overlap {out['overlap_b16']['streams_4']}: "
        f"passed={out['gate_passed']}")
    return out


def _gate(out: dict, best: float, overlap_4: float | None) -> None:
    """The gate's figures and verdict into ``out`` (``overlap_4`` None: not measured)."""
    out["gate_figures"] = {"fwd_bwd_us_per_time_step_b16": best, "overlap_4_streams": overlap_4}
    out["gate_passed"] = bool(best > GATE_US_PER_TIME_STEP or (overlap_4 is not None and overlap_4 < GATE_OVERLAP_4))


# --- bench: eager and captured, with kernel launches -------------------------------------------


def _launches(step, batches, device: str) -> dict | None:
    """Host launches (kernels, graphs, copies) and GPU kernels per step, from the profiler."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    step(batches[0])
    steps._sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for batch in batches[:2]:
            step(batch)
        steps._sync(device)
    events = prof.key_averages()
    host = sum(e.count for e in events if e.key.startswith(("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cudaMemcpy", "cudaMemset")))
    kernels = sum(e.count for e in events if str(getattr(e, "device_type", "")).endswith("CUDA"))
    return {"launches_per_step": host / 2, "gpu_kernels_per_step": kernels / 2}


def captured_step(args, model):
    """(the captured training step of ``model``, the encoder it runs), or (None, why not). A
    reader refused only for its encoder's host lengths runs ``PaddedLoop`` in its place on CUDA."""
    from iaa.jobs.train import bench
    from iaa.jobs.training import captured
    from iaa.jobs.training.step import build_optimizer

    refused, note = captured.refusal(model, args.device), "the reader's own"
    if refused is not None and "lengths on the host" in refused and args.device == "cuda":
        model.kernels = replace(model.kernels, encoder=PaddedLoop())           # rebinds the reader's slots
        note = "PaddedLoop (stand-in: the reader's own encoder is refused)"
    elif refused is not None:
        return None, refused
    optimizer = build_optimizer(model, bench.LR, bench.EMBED_L2, capturable=True)
    return captured.CapturedStep(model, optimizer), note


def _bench_batches(args, cfg, shapes: int | None = None):
    from iaa.data.loading.batch import pad_to_buckets
    from iaa.jobs.modeling import graphs
    from iaa.jobs.train import bench

    size, count = (4, 4) if args.tiny else (COMPARE_BATCH, 24)
    pool = bench.synthetic_examples(size * count, vocab_size=cfg.vocab_size)
    batches = [pad_to_buckets(bench.collate(g, args.device)) for g in bench.bucketed_batches(pool, size)]
    if shapes:
        common = sorted({graphs.shape_of(b) for b in batches},
                        key=lambda s: -sum(graphs.shape_of(b) == s for b in batches))[:shapes]
        batches = [b for b in batches if graphs.shape_of(b) in common]
    return batches


def _bench_step(args, precision: str, capture: bool, triton: bool = False) -> dict:
    """Training ex/s at batch 32 of today's eager step or the captured one, with launches per
    step; then inference ex/s of the trained reader, eager or captured alike. ``triton``: the
    reader's encoder is our own Triton GRU (``model.triton_gru``)."""
    from iaa.jobs.training.step import train_step

    cfg, model, optimizer = steps._reader(args, precision, **({"triton_gru": True} if triton else {}))
    out: dict = {"precision": precision, "captured": capture, "encoder_kernel": type(model.kernels.encoder).__name__}
    if capture:
        step, note = captured_step(args, model)
        if step is None:
            return {**out, "refused": note}
        out["encoder"] = note
    else:
        step = lambda batch: train_step(model, optimizer, batch)           # noqa: E731
    batches = _bench_batches(args, cfg, CAPTURED_SHAPES if capture else None)
    out["batch_size"] = len(batches[0])
    out["train_examples_per_s"] = _rate(args, step, batches)
    out.update(_launches(step, batches, args.device) or {"launches_per_step": None})
    out["infer_examples_per_s"] = _infer_rate(args, model, batches, capture)
    say(f"{precision} {'captured' if capture else 'eager'} batch {len(batches[0])}: {out['train_examples_per_s']:,.0f} ex/s, "
        f"{out['launches_per_step']} launches per step; inference {out['infer_examples_per_s']:,.0f} ex/s")
    return out


def _infer_rate(args, model, batches, capture: bool) -> float:
    """Inference ex/s over ``batches`` (eval mode, no gradients), eager or replayed from CUDA
    graphs (:class:`iaa.jobs.modeling.graphs.CapturedForward`, as validation runs on the card)."""
    import torch

    from iaa.jobs.modeling.graphs import CapturedForward

    model.eval()
    forward = CapturedForward(model) if capture else (lambda batch: model(batch).log_probs)
    with torch.no_grad():
        rate = _rate(args, forward, batches)
    model.train()
    return rate


def _rate(args, fn, batches) -> float:
    """Examples per second of ``fn`` over ``batches``, after one untimed pass (every shape captured)."""
    for batch in batches:
        fn(batch)
    steps._sync(args.device)
    start = time.perf_counter()
    for batch in batches:
        fn(batch)
    steps._sync(args.device)
    return round(len(batches) * len(batches[0]) / (time.perf_counter() - start), 1)


def step_bench(args) -> dict:
    """``device_steps.step_bench``'s figures (fp32 and bf16, eager), then each precision's step
    eager and captured with its launches per step (``steps``); where Triton runs, each
    precision's captured step again with our own Triton GRU as the encoder (``*_captured_triton``)."""
    out = steps.step_bench(args)
    out["steps"] = {}
    variants = [(precision, capture, False) for precision in ("fp32", "bf16") for capture in (False, True)]
    if _triton_encoder(args.device)[0] is not None:
        variants += [("fp32", True, True), ("bf16", True, True)]
    for precision, capture, triton in variants:
        key = f"{precision}_{'captured' if capture else 'eager'}{'_triton' if triton else ''}"
        try:
            out["steps"][key] = _bench_step(args, precision, capture, triton)
        except Exception as error:  # noqa: BLE001 - one variant's failure is a figure, not the end of the step
            out["steps"][key] = {"error": f"{type(error).__name__}: {error}"[:500]}
            say(f"{key}: FAILED {out['steps'][key]['error']}")
        partial(out)
    return out


STEP_FUNCTIONS = {name[len("step_"):]: fn for name, fn in globals().items() if name.startswith("step_")}
