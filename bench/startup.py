"""Start-up and per-call cost of lazyenc, measured side by side in one run.

    python bench/startup.py [--runs 15] [--config config.example.toml]

1. Fresh processes: bare `python -c pass` against `import lazyenc` + manager
   init from TOML + status(), lazily and with lazy_encoders = false (eager).
   Wall time is spawn-to-exit (median of runs, the variants interleaved);
   RSS is the child's peak.
   Bytecode is written and warmed first (PYTHONDONTWRITEBYTECODE is dropped
   for the children): an installed package has its .pyc files, and compiling
   the sources anew on every start is not what users pay.
2. The proxy's overhead per call: a no-op model called through a loaded proxy
   against the same model called directly (best of 5 rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STDLIB = ("typing", "json", "threading", "weakref", "importlib.util", "tomllib")
PEAK = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"


def run(code: str, env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall seconds and median peak RSS bytes of `python -c code`."""
    times, rss = [], []
    for _ in range(runs):
        t, r = spawn(code, env)
        times.append(t)
        rss.append(r)
    return statistics.median(times), statistics.median(rss)


def spawn(code: str, env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds (spawn to exit) and peak RSS bytes of one `python -c code`."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, int(out.stdout.strip().splitlines()[-1])


def side_by_side(codes: dict[str, str], env: dict[str, str], runs: int) -> dict[str, tuple[float, float]]:
    """Median (seconds, peak RSS) of each code, the runs interleaved: A B C A B C ...

    This machine's speed drifts by 10 to 30 % over tens of seconds; interleaving
    gives every variant the same share of slow and fast moments.
    """
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in codes}
    for _ in range(runs):
        for name, code in codes.items():
            samples[name].append(spawn(code, env))
    return {
        name: (statistics.median(t for t, _ in got), statistics.median(r for _, r in got))
        for name, got in samples.items()
    }


def per_call_overhead(*, batch: bool, rounds: int = 5, number: int = 200_000) -> tuple[float, float]:
    """(direct µs, through-proxy µs) per call of a no-op encode, with or without the batcher."""
    sys.path.insert(0, str(ROOT))
    from lazyenc import BatchSettings, EncoderManager
    from lazyenc.testing import FakeLoader, make_settings

    class Noop:
        def encode(self, inputs: object, **kwargs: object) -> object:
            return inputs

    model = Noop()
    settings = make_settings({"noop": "dense"})
    if not batch:
        enc = settings.encoders[0].replace(batch=BatchSettings(enabled=False))
        settings = settings.replace(encoders=(enc,))
    mgr = EncoderManager(settings, loaders={"noop": FakeLoader(model_factory=lambda: model)})
    proxy = mgr["noop"]
    proxy.load()
    args = ["x"]
    direct = min(timeit.repeat(lambda: model.encode(args), number=number, repeat=rounds)) / number
    proxied = min(timeit.repeat(lambda: proxy.encode(args), number=number, repeat=rounds)) / number
    return direct * 1e6, proxied * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--config", default=str(ROOT / "config.example.toml"))
    args = parser.parse_args()

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.pop("LAZYENC_LAZY_ENCODERS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    init = f"import lazyenc; m = lazyenc.EncoderManager.from_toml({args.config!r}); m.status(); {PEAK}"
    n_enc = len(__import__("tomllib").loads(Path(args.config).read_text())["encoders"])

    run(init, env, 1)  # writes lazyenc's .pyc files
    # What `import lazyenc` + init + status() import beyond bare python (tomllib brings re and datetime).
    stdlib = f"import {', '.join(STDLIB)}; {PEAK}"
    measured = side_by_side({"bare": f"pass; {PEAK}", "lazy": init, "stdlib": stdlib}, env, args.runs)
    (bare_t, bare_rss), (lazy_t, lazy_rss) = measured["bare"], measured["lazy"]
    eager_t, eager_rss = run(init, dict(env, LAZYENC_LAZY_ENCODERS="0"), max(1, args.runs // 5))

    mib = 2**20
    print(f"fresh processes, median of {args.runs} runs ({n_enc} encoders configured: {args.config})")
    print(f"{'':34}{'wall ms':>10}{'peak RSS MiB':>14}{'vs bare ms':>12}{'vs bare MiB':>13}")
    for label, t, r in (
        ("python -c pass", bare_t, bare_rss),
        ("lazyenc import+init+status (lazy)", lazy_t, lazy_rss),
        ("same, lazy_encoders = false", eager_t, eager_rss),
    ):
        print(
            f"{label:34}{t * 1e3:10.1f}{r / mib:14.1f}{(t - bare_t) * 1e3:12.1f}{(r - bare_rss) / mib:13.1f}"
        )
    print(
        f"lazy init: eager takes {eager_t / lazy_t:.0f}x the time and {eager_rss / lazy_rss:.0f}x the peak RSS"
    )
    goal_t, goal_m = (lazy_t - bare_t) * 1e3 <= 50, (lazy_rss - bare_rss) / mib <= 15
    print(f"goal init within 50 ms and 15 MiB of bare python: {'met' if goal_t and goal_m else 'NOT met'}")
    stdlib_t = measured["stdlib"][0]
    print(
        f"of which the standard-library modules lazyenc needs ({', '.join(STDLIB)}) "
        f"alone: {(stdlib_t - bare_t) * 1e3:.1f} ms; "
        f"lazyenc's own modules, the TOML parse and the probes: {(lazy_t - stdlib_t) * 1e3:.1f} ms"
    )

    direct, proxied = per_call_overhead(batch=False)
    print(
        f"\nper call, no-op model, batch = false: direct {direct:.3f} µs, through the proxy {proxied:.3f} µs"
    )
    overhead = proxied - direct
    print(
        f"proxy overhead {overhead:.3f} µs per call (goal < 10 µs: {'met' if overhead < 10 else 'NOT met'})"
    )
    direct, batched = per_call_overhead(batch=True, number=20_000)
    print(
        f"batching on (the default): a lone caller's hand-off to the batch worker costs "
        f"{batched:.1f} µs per call ({batched - direct:.1f} µs over direct)"
    )


if __name__ == "__main__":
    main()
