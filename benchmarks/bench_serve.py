"""Load test: ``iaa-cli serve`` (Ray Serve) against ``mlflow models serve``, same model, same run.

    python benchmarks/bench_serve.py --workdir WORKDIR --model models:/demo-reader/1 \
        --cbt-recon ../shared/data/cbt-recon/CBTest/data/cbtest_NE_valid_2000ex.txt --out docs/serve-bench.json

Both servers serve the registered model from the workdir's MLflow store and get the same
requests: real questions (the demo valid split, and a sample of a CBT valid file), one
malformed request in ten (broken JSON, a missing field, a wrong type, in turn) and one oversized
document in a hundred. Concurrency levels run one after the other, each level on Ray Serve and
then on MLflow, so that load from other processes of the machine falls on both alike.

For each level and server: throughput (good requests answered per second), p50/p95/p99 latency
of the good requests, errors among the good requests (anything but 200), and how the bad ones
were answered. Then, on Ray Serve with two replicas, one replica is killed at a quarter of a
concurrency-8 run: the good requests lost are counted against those in flight at that moment,
and the time until Serve has two running replicas again is measured.

``--cold-start`` first measures the first answer of ``iaa-cli serve --model`` in a fresh
process: from an empty C++ build cache (``TORCH_EXTENSIONS_DIR`` in a new folder) and again
from the built one, and the first answer of ``mlflow models serve`` from the built one.

Only loopback addresses are used. Timings on a shared machine are noisy: compare the two
servers within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOST = "127.0.0.1"
MAX_DOCUMENT_WORDS = 5000


# --- requests ------------------------------------------------------------------------------------


def questions(cbt_recon: Path | None, cbt_sample: int, seed: int = 0) -> list[dict[str, Any]]:
    """Demo valid questions, then a seeded sample of a CBT-format valid file, as predict records."""
    from iaa.data.formats import cbt, demo

    with tempfile.TemporaryDirectory() as tmp:
        demo_valid = demo.write_files(Path(tmp))["valid"]
        pool = [_record(ex) for ex in cbt.read(demo_valid).examples()]
    if cbt_recon is not None:
        recon = cbt.read(cbt_recon).examples()
        pool += [_record(ex) for ex in random.Random(seed).sample(recon, min(cbt_sample, len(recon)))]
    random.Random(seed).shuffle(pool)
    return pool


def _record(ex: Any) -> dict[str, Any]:
    return {"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
            "candidates": list(ex.candidates), "answer": ex.answer}


def request_mix(pool: list[dict[str, Any]], n: int) -> list[tuple[str, Any]]:
    """``n`` requests: ("good", record), and every 10th ("malformed", ...), every 100th ("oversized", record)."""
    out: list[tuple[str, Any]] = []
    for i in range(n):
        q = pool[i % len(pool)]
        if i % 100 == 50:
            out.append(("oversized", {**q, "document": " ".join([q["document"]] * (MAX_DOCUMENT_WORDS // 10))}))
        elif i % 10 == 5:
            kind = (i // 10) % 3
            bad = ({**q, "query": 7} if kind == 2 else {k: v for k, v in q.items() if k != "candidates"})
            out.append(("malformed", b'{"document": "a b", "query' if kind == 0 else bad))
        else:
            out.append(("good", q))
    return out


def body_for(server: str, item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    return json.dumps({"dataframe_records": [item]} if server == "mlflow" else item).encode()


# --- load ----------------------------------------------------------------------------------------


async def drive(url: str, bodies: list[tuple[str, bytes]], concurrency: int,
                on_progress: Any = None) -> dict[str, Any]:
    """Send ``bodies`` with ``concurrency`` clients; latencies and statuses per kind."""
    import aiohttp

    queue: asyncio.Queue = asyncio.Queue()
    for i, item in enumerate(bodies):
        queue.put_nowait((i, item))
    results: list[tuple[str, int, float]] = []
    spans: list[tuple[float, float, int]] = []          # (start, end, status) of every request
    in_flight = [0]
    errors: dict[str, int] = {}                          # client-side failures by exception type

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i, (kind, body) = queue.get_nowait()
            start = time.perf_counter()
            in_flight[0] += 1
            try:
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as reply:
                    await reply.read()
                    status = reply.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                status = -1
                errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
            in_flight[0] -= 1
            end = time.perf_counter()
            results.append((kind, status, end - start))
            spans.append((start, end, status))
            if on_progress is not None:
                await on_progress(len(results), in_flight[0])

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {**summarize(results, wall), "client_errors": errors, "spans": spans}


def summarize(results: list[tuple[str, int, float]], wall: float) -> dict[str, Any]:
    good = [(s, t) for k, s, t in results if k == "good"]
    ok = sorted(t for s, t in good if s == 200)
    pct = lambda p: round(1000 * ok[min(len(ok) - 1, int(p / 100 * len(ok)))], 1) if ok else None  # noqa: E731
    statuses = lambda kind: dict(sorted(_count(s for k, s, _ in results if k == kind).items()))  # noqa: E731
    return {"requests": len(results), "good": len(good), "good_ok": len(ok), "good_errors": len(good) - len(ok),
            "seconds": round(wall, 2), "throughput_rps": round(len(ok) / wall, 1),
            "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
            "mean_ms": round(1000 * statistics.fmean(ok), 1) if ok else None,
            "malformed_statuses": statuses("malformed"), "oversized_statuses": statuses("oversized")}


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


# --- servers -------------------------------------------------------------------------------------


def wait_for(url: str, body: bytes | None, timeout_s: float, proc: subprocess.Popen | None = None) -> float:
    """Seconds until ``url`` answers 200 (a POST of ``body``, or a GET)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering {url}")
        try:
            request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as reply:
                if reply.status == 200:
                    return time.perf_counter() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s:g} s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_mlflow(model: str, tracking_uri: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(["mlflow", "models", "serve", "-m", model, "--env-manager", "local", "-h", HOST,
                             "-p", str(port)], env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cold_start(args: argparse.Namespace, question: dict[str, Any]) -> dict[str, Any]:
    """First answers of fresh server processes: iaa-cli serve with an empty and a built C++
    cache, and mlflow models serve with the built one."""
    out: dict[str, Any] = {}
    cache = Path(tempfile.mkdtemp(prefix="iaa-ext-"))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache), "MLFLOW_TRACKING_URI": args.tracking_uri}
    for label in ("serve_cold_cache", "serve_warm_cache"):
        port = free_port()
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "iaa.cli", "serve", "--model", args.model, "--port", str(port),
                                 "--workdir", str(args.workdir)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for(f"http://{HOST}:{port}/predict", json.dumps(question).encode(), 900, proc)
            first = time.perf_counter() - started
            with urllib.request.urlopen(f"http://{HOST}:{port}/ready", timeout=30) as reply:
                load = json.loads(reply.read())["load_seconds"]
        finally:
            stop(proc, signal.SIGINT)
        out[label] = {"first_answer_s": round(first, 1), "replica_load_s": load}
        print(f"{label}: first answer {first:.1f} s after the process started (replica load {load:.1f} s)",
              file=sys.stderr)
    port = free_port()
    started = time.perf_counter()
    proc = start_mlflow(args.model, args.tracking_uri, port, {"TORCH_EXTENSIONS_DIR": str(cache)})
    try:
        ping = wait_for(f"http://{HOST}:{port}/ping", None, 900, proc)
        first = wait_for(f"http://{HOST}:{port}/invocations", body_for("mlflow", question), 900, proc)
    finally:
        stop(proc)
    out["mlflow_warm_cache"] = {"ping_s": round(ping, 1), "first_answer_s": round(time.perf_counter() - started, 1)}
    print(f"mlflow_warm_cache: /ping after {ping:.1f} s, first answer {out['mlflow_warm_cache']['first_answer_s']} s",
          file=sys.stderr)
    return out


def kill_run(url: str, pool: list[dict[str, Any]], n: int, concurrency: int, app: str) -> dict[str, Any]:
    """A run during which one of two replicas is killed at a quarter of the requests."""
    from iaa.platform import ray_serve as platform_serve

    bodies = [("good", body_for("serve", q)) for q in pool[:n]]
    state: dict[str, Any] = {}

    async def on_progress(done: int, in_flight: int) -> None:
        if "killed" not in state and done >= len(bodies) // 4:
            state["in_flight"] = in_flight
            state["killed"] = platform_serve.kill_replica(app)
            state["at"] = time.perf_counter()

    summary = asyncio.run(drive(f"{url}/predict", bodies, concurrency, on_progress))
    spans = summary.pop("spans")
    failed = [(start, end) for start, end, status in spans if status != 200]
    # The replica dies a little after ray.kill returns; the first failure marks its death. The
    # requests in flight then (on either replica) bound what can be lost.
    death = min((end for _, end in failed), default=None)
    in_flight_at_death = sum(start < death <= end for start, end, _ in spans) if death else 0
    sent_after_death = sum(start >= death for start, _ in failed) if death else 0
    deadline = time.perf_counter() + 300
    while not (restored := platform_serve.replaced(app, state["killed"], 2)) and time.perf_counter() < deadline:
        time.sleep(0.5)
    return {**summary, "killed": state.get("killed"), "in_flight_at_kill": state.get("in_flight"),
            "in_flight_at_death": in_flight_at_death, "lost_sent_after_death": sent_after_death,
            "lost_statuses": _count(status for _, _, status in spans if status != 200),
            "lost": summary["good_errors"], "replicas_running_again": restored,
            "two_replicas_again_within_s": round(time.perf_counter() - state["at"], 1) if restored else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="holds mlflow.db with the registered model")
    parser.add_argument("--model", default="models:/demo-reader/1")
    parser.add_argument("--tracking-uri", help="default: sqlite:///WORKDIR/mlflow.db")
    parser.add_argument("--cbt-recon", type=Path, help="a CBT-format valid file to sample questions from")
    parser.add_argument("--cbt-sample", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=600, help="requests per level (level 1: a third)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--skip-mlflow", action="store_true")
    parser.add_argument("--cold-start", action="store_true")
    parser.add_argument("--kill-requests", type=int, default=400, help="0: no replica is killed")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()
    args.tracking_uri = args.tracking_uri or f"sqlite:///{args.workdir / 'mlflow.db'}"

    pool = questions(args.cbt_recon, args.cbt_sample)
    report: dict[str, Any] = {"model": args.model, "questions": len(pool), "cpus": os.cpu_count(),
                              "replicas": args.replicas, "max_batch": args.max_batch,
                              "batch_wait_ms": args.batch_wait_ms, "levels": []}
    if args.cold_start:
        report["cold_start"] = cold_start(args, next(q for q in pool if len(q["document"].split()) < 400))

    import ray

    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve as platform_serve

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    cfg = job.config(model_uri=args.model, checkpoint=None, ensemble_dir=None, data_dir=None, workdir=args.workdir,
                     tracking_uri=args.tracking_uri, replicas=args.replicas, max_batch=args.max_batch,
                     batch_wait_ms=args.batch_wait_ms, port=free_port(), max_document_words=MAX_DOCUMENT_WORDS)
    serve_url = platform_serve.start(cfg, job.CODE)
    mlflow_proc, mlflow_url = None, None
    if not args.skip_mlflow:
        port = free_port()
        mlflow_proc, mlflow_url = start_mlflow(args.model, args.tracking_uri, port), f"http://{HOST}:{port}"
        wait_for(f"{mlflow_url}/invocations", body_for("mlflow", pool[0]), 900, mlflow_proc)
    try:
        for concurrency in args.concurrency:
            n = args.requests // 3 if concurrency == 1 else args.requests
            mix = request_mix(pool, n)
            for server, url in (("ray-serve", f"{serve_url}/predict"), ("mlflow", f"{mlflow_url}/invocations")):
                if server == "mlflow" and mlflow_proc is None:
                    continue
                bodies = [(kind, body_for("mlflow" if server == "mlflow" else "serve", item)) for kind, item in mix]
                result = {"server": server, "concurrency": concurrency, **asyncio.run(drive(url, bodies, concurrency))}
                result.pop("spans")
                report["levels"].append(result)
                print(json.dumps(result), file=sys.stderr)
        if args.kill_requests and args.replicas == 2:
            report["kill"] = kill_run(serve_url, pool, args.kill_requests, 8, cfg.app_name)
            print(json.dumps(report["kill"]), file=sys.stderr)
    finally:
        if mlflow_proc is not None:
            stop(mlflow_proc)
        platform_serve.stop(cfg.app_name)
        ray.shutdown()
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
