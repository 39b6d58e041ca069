"""What loading a checkpoint costs: ``checkpoint.load_model`` (the reader built without
initialising it, then given the checkpoint's weights) against the same load with the reader
initialised first, as training builds it. Both in one process, alternated, so the ratio holds on
a shared machine.

    python benchmarks/bench_load.py [VOCAB ...] [--rounds N]

For each vocabulary size (default: 50,000, about CBT's, and 120,000, about CNN's) it writes a
checkpoint of the paper-config reader to a temporary folder, loads it once each way, and prints
one JSON line: the median seconds of each way over N rounds (default 7) and their ratio.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from iaa.jobs.modeling import checkpoint
from iaa.jobs.config.job_config import JobConfig, from_dict
from iaa.model import build_reader
from iaa.model.config import preset


def initialised_load(path: Path) -> torch.nn.Module:
    """``load_model`` as it was: the reader initialised, then overwritten."""
    state = checkpoint.load(path)
    cfg = from_dict(state["config"])
    model = build_reader(cfg.model)
    checkpoint.load_weights(model, state, path)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocab", nargs="*", type=int, default=[50_000, 120_000])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for vocab in args.vocab:
        with tempfile.TemporaryDirectory() as folder:
            cfg = JobConfig(model=preset("paper", vocab_size=vocab))
            reader = build_reader(cfg.model)
            path = checkpoint.save(Path(folder) / "best.pt", checkpoint.make_state(cfg, reader))
            ways = {"load_model": lambda: checkpoint.load_model(path), "initialised": lambda: initialised_load(path)}
            for way in ways.values():                # the first load pays for imports and kernel builds
                way()
            seconds: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, way in ways.items():
                    start = time.perf_counter()
                    way()
                    seconds[name].append(time.perf_counter() - start)
            medians = {name: statistics.median(values) for name, values in seconds.items()}
            params = sum(p.numel() for p in reader.parameters())
            print(json.dumps({"vocab": vocab, "params_m": round(params / 1e6, 1),
                              **{f"{name}_s": round(value, 3) for name, value in medians.items()},
                              "ratio": round(medians["load_model"] / medians["initialised"], 3)}), flush=True)


if __name__ == "__main__":
    main()
