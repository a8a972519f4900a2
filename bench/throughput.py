"""Throughput of micro-batching on the real packaged models (issue 4).

For dense, rerank and sparse, side by side in one process:

- one at a time: the model called directly, one text per call, one caller;
- offline batch: the model called directly once on every text, the ceiling on
  this machine: the best of batch_size 64, 16 and 8 (the model sorts all the
  texts by length first, so its chunks pad little);
- through the proxy: C threads each making single-text calls, for
  C = 1, 2, 4, 8, 16, 32, with throughput, p50/p99 latency and the mean batch
  size the worker ran, and at 16 and 32 callers the share of the wall time
  the worker ran batches and the share of batches split across parallel lanes.

Each figure is the best of ``--runs`` runs (throughput: highest; latency:
lowest). The goals for dense: at 16 callers >= 3x one-at-a-time, at 32 callers
>= 80% of the offline ceiling.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/throughput.py            # ~3-4 min
    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/throughput.py --quick    # ~1 min
    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/throughput.py --kinds dense --parallel 1  # lanes off

The rerank model is MiniLM with an untrained scoring head: real compute, the
scores themselves are meaningless.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lazyenc import EncoderManager, load_config  # noqa: E402

CALLERS = (1, 2, 4, 8, 16, 32)
OFFLINE_SIZES = (64, 16, 8)
WORDS = (
    "the a model encoder batch text query document search vector quick brown fox jumps over lazy dog "
    "server thread request latency throughput queue worker memory cpu token sentence embedding "
    "language paris london river mountain music history science data network system user"
).split()


def make_texts(n: int, seed: int = 0, words: tuple[int, int] = (4, 20)) -> list[str]:
    """Sentences of a uniform random number of common words (about one token each)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) for _ in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def one_at_a_time(call: Callable[[Any], Any], items: list[Any]) -> float:
    started = time.perf_counter()
    for item in items:
        call(item)
    return len(items) / (time.perf_counter() - started)


def offline(call_all: Callable[[list[Any]], Any], items: list[Any]) -> float:
    started = time.perf_counter()
    call_all(items)
    return len(items) / (time.perf_counter() - started)


def concurrent(call: Callable[[Any], Any], items: list[Any], callers: int) -> tuple[float, list[float]]:
    """``callers`` threads share ``items``, one single-item call each time; texts/s and latencies."""
    latencies: list[list[float]] = [[] for _ in range(callers)]
    lock = threading.Lock()
    next_index = [0]
    barrier = threading.Barrier(callers + 1)
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        barrier.wait()
        mine = latencies[slot]
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(items):
                return
            t0 = time.perf_counter()
            try:
                call(items[i])
            except BaseException as exc:
                errors.append(exc)
                return
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(callers)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return len(items) / elapsed, [x for lat in latencies for x in lat]


class BusyTimer:
    """Time the encoder's batch worker spends running batches (model calls and handing out rows)."""

    def __init__(self, batcher: Any) -> None:
        self.batcher = batcher
        self.busy = 0.0

    def __enter__(self) -> BusyTimer:
        inner = self.batcher._run

        def timed(batch: Any) -> None:
            started = time.perf_counter()
            try:
                inner(batch)
            finally:
                self.busy += time.perf_counter() - started

        self.batcher._run = timed  # an instance attribute shadows the method
        return self

    def __exit__(self, *exc: object) -> None:
        del self.batcher._run


def bench_kind(mgr: EncoderManager, name: str, items: list[Any], runs: int) -> dict[str, Any]:
    proxy = mgr[name]
    model = proxy.load()
    if name == "rerank":
        direct = model.predict
        through = proxy.predict
    else:
        direct = model.encode
        through = proxy.encode
    # Warm-up: first calls pay for lazy initialisation inside torch and the tokenizer.
    direct(items[:8], batch_size=8)
    for item in items[:4]:
        through(item)

    best: dict[str, Any] = {"single": 0.0, "ceiling": 0.0, "offline": dict.fromkeys(OFFLINE_SIZES, 0.0)}
    best["callers"] = {}
    for run in range(runs):
        best["single"] = max(best["single"], one_at_a_time(direct, items))
        for size in OFFLINE_SIZES:
            rate = offline(lambda xs, size=size: direct(xs, batch_size=size), items)
            best["offline"][size] = max(best["offline"][size], rate)
            best["ceiling"] = max(best["ceiling"], rate)
        for c in CALLERS:
            before = proxy.status()
            split_before = proxy._batcher.batches_split
            with BusyTimer(proxy._batcher) as timer:
                tput, lat = concurrent(through, items, c)
            after = proxy.status()
            batches = after.batches_run - before.batches_run
            if c in (16, 32):
                # Where the gap to the ceiling is: the worker idle between batches, or the batches?
                seen = best.setdefault("anatomy", {}).setdefault(c, {"busy": 0.0, "split": 0.0})
                seen["busy"] = max(seen["busy"], timer.busy * tput / len(items))
                split = proxy._batcher.batches_split - split_before
                seen["split"] = max(seen["split"], split / batches if batches else 0.0)
            mean_batch = len(items) / batches if batches else float("nan")
            fresh = {"tput": 0.0, "p50": float("inf"), "p99": float("inf"), "mb": 0.0}
            row = best["callers"].setdefault(c, fresh)
            if tput > row["tput"]:
                row["tput"], row["mb"] = tput, mean_batch
            row["p50"] = min(row["p50"], percentile(lat, 0.5) * 1000)
            row["p99"] = min(row["p99"], percentile(lat, 0.99) * 1000)
        print(f"  [{name}] run {run + 1}/{runs} done", file=sys.stderr, flush=True)
    return best


def report(name: str, what: str, n: int, runs: int, best: dict[str, Any], *, goals: bool) -> None:
    single, ceiling = best["single"], best["ceiling"]
    print(f"\n### {name}: {what}, {n} inputs, best of {runs}\n")
    print(f"- one at a time, direct: {single:.1f} /s")
    print(
        f"- one offline call of all {n} (ceiling): {ceiling:.1f} /s "
        f"({', '.join(f'batch_size {size}: {rate:.1f} /s' for size, rate in best['offline'].items())})"
    )
    at16 = best["callers"][16]["tput"]
    print(
        f"- 16 threads of single calls through the proxy: {at16:.1f} /s = "
        f"{at16 / single:.2f}x one-at-a-time, {100 * at16 / ceiling:.0f}% of the ceiling\n"
    )
    print("| callers | inputs/s | x one-at-a-time | % of ceiling | p50 ms | p99 ms | mean batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c, row in best["callers"].items():
        print(
            f"| {c} | {row['tput']:.1f} | {row['tput'] / single:.2f}x | {100 * row['tput'] / ceiling:.0f}% "
            f"| {row['p50']:.1f} | {row['p99']:.1f} | {row['mb']:.1f} |"
        )
    for c, seen in best.get("anatomy", {}).items():
        print(
            f"- {c} callers: the worker ran batches {seen['busy']:.0%} of the wall time; "
            f"{seen['split']:.0%} of them split across parallel lanes"
        )
    if goals:
        at16 = best["callers"][16]["tput"] / single
        at32 = best["callers"][32]["tput"] / ceiling
        verdict = {True: "met", False: "NOT met"}
        print(f"\ngoal 16 callers >= 3x one-at-a-time: {at16:.2f}x -> {verdict[at16 >= 3]}")
        print(f"goal 32 callers >= 80% of ceiling:   {100 * at32:.0f}% -> {verdict[at32 >= 0.8]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "config.example.toml"))
    parser.add_argument("--quick", action="store_true", help="fewer inputs, one run (about a minute)")
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (default 3, quick 1)")
    parser.add_argument("--texts", type=int, default=None, help="inputs per figure (default 256, quick 128)")
    parser.add_argument("--kinds", default="dense,rerank,sparse")
    parser.add_argument(
        "--parallel",
        default=None,
        help='override batch.parallel for every kind: N or "auto" (default: the config\'s)',
    )
    parser.add_argument(
        "--words", default="4,20", help="MIN,MAX words per text (default 4,20; queries are 3-10)"
    )
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    n = args.texts or (128 if args.quick else 256)
    logging.getLogger("sentence_transformers").setLevel(logging.WARNING)

    import torch

    low, high = (int(x) for x in args.words.split(","))
    texts = make_texts(n, words=(low, high))
    queries = make_texts(16, seed=1, words=(3, 10))
    pairs = [(queries[i % len(queries)], t) for i, t in enumerate(texts)]
    started = time.perf_counter()
    settings = load_config(args.config)
    if args.parallel is not None:
        parallel = None if args.parallel == "auto" else int(args.parallel)
        settings = settings.replace(
            encoders=tuple(e.replace(batch=e.batch.replace(parallel=parallel)) for e in settings.encoders)
        )
    with EncoderManager(settings) as mgr:
        print(
            f"# Throughput (issue 4): torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
            f"texts of {low}-{high} words"
        )
        for name in args.kinds.split(","):
            enc = mgr.settings.encoder(name)
            b = enc.batch
            what = (
                f"{enc.model} (batch max_size={b.max_size}, max_wait_ms={b.max_wait_ms:g}, "
                f"parallel={b.parallel or 'auto'})"
            ) + (" - untrained head, scores meaningless" if name == "rerank" else "")
            best = bench_kind(mgr, name, pairs if name == "rerank" else texts, runs)
            report(name, what, n, runs, best, goals=name == "dense")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
