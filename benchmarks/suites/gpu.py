"""Library-level run: an asyncio server loop feeding an encoder, preprocessing under each strategy.

Clients submit texts; each request is tokenized through the strategy under test
(the loop's own work if it is `inline`), then queued for an "engine" thread that
runs a randomly initialised BERT-base-sized encoder (built from a config, nothing
downloaded) on the GPU when there is one. Per strategy: items/s; the GPU's
utilization as NVML reports it (the share of time a kernel ran, sampled every
50 ms; on CUDA only, where `pynvml` imports); the share of wall time the engine
thread spent in its forwards (launches and the wait for the device, the wait
for the GIL included, so not the device's busy time); the CPU time of this
process and its children per item; and the event loop's lag.

    python -m benchmarks gpu            # BERT-base, on cuda if available, 5 rounds
    python -m benchmarks gpu --smoke    # 1-layer model, CPU, seconds

Each round runs every row once, in a fresh random order; the report gives
medians over rounds with order-statistic intervals, and per-round ratios of
each row to `run_in_executor` (the loop's default thread pool, as vLLM's shared
pool). Results are rewritten after every round, so a run cut short keeps the
rounds it finished.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import queue
import random
import sys
import threading
import time
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import library, progress, stats
from benchmarks.harness.workloads import long_texts


def _packaged_tokenizer_dir() -> str:
    from benchmarks.harness.models import minilm_dir

    return str(minilm_dir())


def load_tokenizer(directory: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def tokenize(texts: list[str], max_length: int) -> Any:
    """The offloaded preprocessing: one request's texts → padded id arrays."""
    enc = library.state()(texts, padding="max_length", truncation=True, max_length=max_length,
                          return_tensors="np")
    return enc["input_ids"], enc["attention_mask"]


def build_model(smoke: bool, device: str) -> Any:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    # Defaults of BertConfig are BERT-base: 12 layers, hidden 768, 12 heads.
    config = BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=2,
                        intermediate_size=128) if smoke else BertConfig()
    model = BertModel(config).eval().to(device)  # type: ignore[no-untyped-call, unused-ignore]
    if device == "cuda":
        model = model.half()
    return model


class Engine(threading.Thread):
    """Runs forwards on batches from a queue; accumulates the wall time spent in them."""

    def __init__(self, model: Any, device: str, max_batch: int) -> None:
        super().__init__(daemon=True)
        self.model, self.device, self.max_batch = model, device, max_batch
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.busy_s = 0.0

    def run(self) -> None:
        import numpy as np
        import torch

        while True:
            item = self.inbox.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.inbox.put(None)
                    break
                batch.append(nxt)
            ids = torch.from_numpy(np.concatenate([b[0][0] for b in batch])).to(self.device)
            mask = torch.from_numpy(np.concatenate([b[0][1] for b in batch])).to(self.device)
            start = time.perf_counter()
            with torch.inference_mode():
                self.model(input_ids=ids, attention_mask=mask)
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.busy_s += time.perf_counter() - start
            for _, (loop, fut) in batch:
                loop.call_soon_threadsafe(fut.set_result, None)


def _tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live children."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


class GpuUtilization(threading.Thread):
    """NVML's utilization of GPU 0 (share of time a kernel ran), sampled every
    50 ms until `stop()`, which returns the mean (None off CUDA or without pynvml)."""

    def __init__(self, device: str) -> None:
        super().__init__(daemon=True)
        self._samples: list[float] = []
        self._done = threading.Event()
        self._nvml: Any = None
        if device == "cuda":
            try:
                import pynvml  # type: ignore[import-not-found, unused-ignore]

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            except Exception:  # no NVML here: the figure is left out
                self._nvml = None
        if self._nvml is not None:
            self.start()

    def run(self) -> None:
        while not self._done.wait(0.05):
            self._samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100)

    def stop(self) -> float | None:
        if self._nvml is None:
            return None
        self._done.set()
        self.join()
        self._nvml.nvmlShutdown()
        return sum(self._samples) / len(self._samples) if self._samples else None


async def serve(executor: Any, engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    import offload

    texts = long_texts(64, args.words)
    loop = asyncio.get_running_loop()
    done = 0

    async def client(cid: int) -> None:
        nonlocal done
        for i in range(args.requests_per_client):
            batch = [texts[(cid + i + j) % len(texts)] for j in range(args.texts_per_request)]
            encoded = await executor.run(tokenize, batch, args.max_length)
            fut: asyncio.Future[None] = loop.create_future()
            engine.inbox.put((encoded, (loop, fut)))
            await fut
            done += len(batch)

    # Warm-up: every worker builds its tokenizer before the clock starts.
    await asyncio.gather(*(executor.run(tokenize, texts[:1], args.max_length) for _ in range(args.workers)))
    engine.busy_s = 0.0
    cpu_before = _tree_cpu_s()
    gpu = GpuUtilization(engine.device)
    async with offload.LoopLagMonitor(interval=0.001) as lag:
        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(args.clients)))
        wall = time.perf_counter() - start
    cpu = _tree_cpu_s() - cpu_before
    gpu_util = gpu.stop()
    return {"items": done, "wall_s": wall, "items_per_s": done / wall, "busy_fraction": engine.busy_s / wall,
            "gpu_util": gpu_util, "cpu_ms_per_item": cpu / done * 1e3 if done else 0.0,
            "lag_p50_ms": lag.p50 * 1e3, "lag_p99_ms": lag.p99 * 1e3, "lag_max_ms": lag.max * 1e3}


def measure(name: str, model: Any, device: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine(model, device, args.max_batch)
    engine.start()
    executor = library.make_executor(name, args.workers, functools.partial(load_tokenizer, args.tokenizer))
    try:
        return asyncio.run(serve(executor, engine, args))
    finally:
        engine.inbox.put(None)
        engine.join()
        executor.shutdown()


#: (key, title, digits) per figure. `busy_fraction` keeps the name it had when
#: it was reported as "device busy"; it is the engine thread's wall time in its
#: forwards (GIL waits included), not the GPU's busy time (that is `gpu_util`).
METRICS = (("items_per_s", "items/s", 0), ("gpu_util", "GPU utilization (NVML)", 2),
           ("cpu_ms_per_item", "CPU ms per item", 3), ("busy_fraction", "engine in forward", 2),
           ("lag_p99_ms", "loop lag p99 ms", 2), ("lag_max_ms", "loop lag max ms", 2))
PAIRED = ("items_per_s", "gpu_util", "cpu_ms_per_item", "lag_p99_ms")


def _cell(values: list[Any], digits: int, base: list[Any] | None = None) -> str:
    """Median [interval] of a row's rounds, or (`base`) of its per-round ratios to the
    baseline's; "n/a" where a machine could not read the figure."""
    if None in values or (base is not None and None in base):
        return "n/a"
    shown = values if base is None else stats.paired_ratios(values, base)
    return stats.fmt(stats.median_interval(shown), digits) + ("" if base is None else "x") if shown else "n/a"


def report(names: list[str], rounds: list[dict[str, dict[str, Any]]]) -> str:
    """Medians [intervals] per row over `rounds`, and per-round ratios to the baseline row."""
    body = [[n, *(_cell([r[n][key] for r in rounds], digits) for key, _, digits in METRICS)] for n in names]
    text = _common.table(["row", *(title for _, title, _ in METRICS)], body)
    base = library.BASELINE
    if base in names and len(names) > 1:
        ratio_rows = [[n, *(_cell([r[n][key] for r in rounds], 2, [r[base][key] for r in rounds]) for key in PAIRED)]
                      for n in names if n != base]
        text += (f"\nPaired per round, row / `{base}` (median [interval]):\n\n"
                 + _common.table(["row", *(title for key, title, _ in METRICS if key in PAIRED)], ratio_rows))
    return text


def main(argv: list[str] | None = None) -> int:
    import torch

    p = _common.parser(__doc__ or "", "gpu")
    p.add_argument("--strategies", nargs="*", help="rows to run (default: every strategy and the baseline)")
    p.add_argument("--rounds", type=int, help="rounds, every row once each (default 5; 1 with --smoke)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the packaged all-MiniLM-L6-v2's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rows' order in each round")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.smoke else 5)
    if rounds < 1:
        p.error("--rounds must be at least 1")
    names = args.strategies or library.rows()
    unknown = sorted(set(names) - set(library.rows()))
    if unknown:
        p.error(f"unknown rows {unknown}; known: {library.rows()}")
    args.tokenizer = args.tokenizer or _packaged_tokenizer_dir()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    # Full: 64 clients × 8 texts of 160 words (128 tokens) per request, 8 workers on a 16-core host.
    args.clients, args.requests_per_client, args.texts_per_request = (4, 3, 2) if args.smoke else (64, 40, 8)
    args.words, args.max_length = (40, 32) if args.smoke else (160, 128)
    args.workers, args.max_batch = (2, 8) if args.smoke else (8, 64)
    model = build_model(args.smoke, device)
    meta = {**_common.machine(), "mode": "smoke" if args.smoke else "full", "device": device,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "command": "python -m benchmarks gpu " + " ".join(sys.argv[1:] if argv is None else argv),
            "rows": names,
            "sizes": {k: getattr(args, k) for k in ("clients", "requests_per_client", "texts_per_request",
                                                    "words", "max_length", "workers", "max_batch")}}
    results: dict[str, Any] = {"meta": meta, "rounds": []}
    order = random.Random(args.seed)
    bar = progress.Progress(rounds * len(names), "gpu rows")
    for number in range(rounds):
        this_round: dict[str, Any] = {}
        for name in order.sample(names, len(names)):
            this_round[name] = measure(name, model, device, args)
            bar.step(f"round {number + 1} {name}")
            bar.note(f"round {number + 1}/{rounds} {name}: "
                     + ", ".join(f"{title} {'n/a' if this_round[name][key] is None else round(this_round[name][key], d)}"
                       for key, title, d in METRICS))
        results["rounds"].append(this_round)
        text = report(names, results["rounds"])
        title = "Library-level: asyncio loop feeding an encoder"
        meta_line = (f"{meta['gpu'] or device}; {len(results['rounds'])} of {rounds} rounds, rows in a fresh random "
                     f"order each round; sizes {meta['sizes']}; torch {meta['torch']}.\n\n")
        tables = f"{_common.start('tables')}\n{text}{_common.end('tables')}\n"
        _common.write(args.out, "gpu_library", results, _common.header(title, meta) + meta_line + tables)
    bar.close()
    print(f"wrote {args.out / 'gpu_library'}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
