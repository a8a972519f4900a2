"""How much RSS does unload() give back? (issue 5)

For each packaged model (dense, rerank, sparse, spacy), in several fresh
processes (3 by default): after its library is imported, RSS before the build,
after the build and 5 calls on 64 texts, and after unload(); then a second
build, the same calls and a second unload in the same process.

The goal (unload gives back at least 75 % of the RSS the build took) is judged
on RSS **without the pages of shared-library file mappings** (``*.so`` and
``*.so.N`` in /proc/self/smaps: clean code and the libraries' data), for the
**worst** of the runs of each model. The first build and the first calls fault
in library code once (libtorch's kernels, the tokenizers extension): those pages
belong to the libraries, stay mapped for as long as the libraries are imported,
are shared with every process that maps them, and the kernel can drop them
(clean, file-backed). No unload can give them back, and they are no memory the
model took. The plain whole-process RSS is printed beside it, with the size of
the excluded part, and so are the second cycle's figures.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python bench/memory.py [--runs N] [--without-trim]

``--without-trim`` adds one run per model where unload skips glibc's
malloc_trim(0) (del + gc.collect only), for comparison; it is not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("dense", "rerank", "sparse", "spacy")
GOAL = 0.75
MIB = 2**20
# A shared library's file mapping: libfoo.so, libc.so.6, _C.cpython-311-x86_64-linux-gnu.so
LIBRARY = re.compile(r"\.so(\.\d+)*$")


def smaps_rss() -> tuple[int, int, int]:
    """(RSS, RSS of shared-library mappings, of which executable) from /proc/self/smaps, in bytes."""
    total = library = code = 0
    in_library = executable = False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
                in_library = len(head) > 5 and bool(LIBRARY.search(head[5].strip()))
                executable = "x" in head[1]
            elif line.startswith("Rss:"):
                kib = int(head[1]) * 1024
                total += kib
                if in_library:
                    library += kib
                    code += kib if executable else 0
    return total, library, code


def measure(kind: str, trim: bool) -> dict[str, float]:
    """Runs in the fresh child process: two build + calls + unload cycles."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if kind == "spacy":
        import spacy  # noqa: F401
    else:
        import sentence_transformers  # noqa: F401

    from lazyenc import EncoderManager, _memory, parse_config

    if not trim:
        _memory.malloc_trim = lambda: False  # del + gc.collect only
    text = (ROOT / "config.example.toml").read_text()
    mgr = EncoderManager(parse_config(text, base_dir=str(ROOT)))
    proxy = mgr[kind]
    texts = [f"sentence number {i} about lazy loading of encoders" for i in range(64)]

    def use() -> None:
        for _ in range(5):
            if kind in ("dense", "sparse"):
                proxy.encode(texts, batch_size=32)
            elif kind == "rerank":
                proxy.predict([("what is lazy loading?", t) for t in texts], batch_size=32)
            else:
                proxy.pipe(texts)

    out: dict[str, float] = {}
    for cycle in (1, 2):
        before = smaps_rss()
        proxy.load()
        use()
        loaded = smaps_rss()
        proxy.unload()
        after = smaps_rss()
        out[f"took{cycle}"] = (loaded[0] - before[0]) / MIB
        out[f"back{cycle}"] = (loaded[0] - after[0]) / MIB
        out[f"so_took{cycle}"] = (loaded[1] - before[1]) / MIB
        out[f"so_left{cycle}"] = (after[1] - before[1]) / MIB
        out[f"code_took{cycle}"] = (loaded[2] - before[2]) / MIB
        out[f"nolib_took{cycle}"] = out[f"took{cycle}"] - out[f"so_took{cycle}"]
        out[f"nolib_back{cycle}"] = out[f"back{cycle}"] - (loaded[1] - after[1]) / MIB
    mgr.close()
    return out


def run_child(kind: str, trim: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    mode = "trim" if trim else "gc"
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, mode], env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"the {kind} child failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def share(back: float, took: float) -> float:
    return back / took if took > 0 else float("nan")


def row(kind: str, label: str, r: dict[str, float]) -> str:
    return (
        f"{kind:<7} {label:<7} | {r['took1']:6.1f} {r['back1']:6.1f} {share(r['back1'], r['took1']):5.0%}"
        f" | {r['so_took1']:6.1f} {r['code_took1']:6.1f} {r['so_left1']:6.1f}"
        f" | {r['nolib_took1']:6.1f} {r['nolib_back1']:6.1f} {share(r['nolib_back1'], r['nolib_took1']):5.0%}"
        f" | {r['took2']:6.1f} {r['back2']:6.1f} {share(r['back2'], r['took2']):5.0%}"
        f" {share(r['nolib_back2'], r['nolib_took2']):7.0%}"
    )


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2], sys.argv[3] == "trim")))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per model (default 3)")
    parser.add_argument("--without-trim", action="store_true", help="add one del + gc only run per model")
    args = parser.parse_args()

    started = time.time()
    print(
        f"RSS given back by unload() (MiB), {args.runs} fresh processes per model; "
        f"first cycle: build + 5 calls, then unload"
    )
    print(
        "'.so pages' are the RSS of shared-library file mappings (*.so, *.so.N in /proc/self/smaps): "
        "library code\nand data faulted in once by the first build and calls, not the model's; "
        "the goal leaves them out.\n"
    )
    header = (
        f"{'model':<7} {'run':<7} | {'whole RSS: took':>15} {'back':>6} {'share':>5}"
        f" | {'.so pages: took':>15} {'(code)':>6} {'left':>6}"
        f" | {'without .so: took':>17} {'back':>6} {'share':>5}"
        f" | {'2nd cycle: took':>15} {'back':>6} {'share':>5} {'w/o .so':>7}"
    )
    print(header)
    print("-" * len(header))
    verdicts: list[str] = []
    for kind in KINDS:
        runs = []
        for i in range(args.runs):
            r = run_child(kind, trim=True)
            runs.append(r)
            print(row(kind, str(i + 1), r), flush=True)
        worst = min(runs, key=lambda r: share(r["nolib_back1"], r["nolib_took1"]))
        print(row(kind, "worst", worst))
        if args.without_trim:
            print(row(kind, "no trim", run_child(kind, trim=False)), flush=True)
        first = share(worst["nolib_back1"], worst["nolib_took1"])
        whole = min(share(r["back1"], r["took1"]) for r in runs)
        second = min(share(r["back2"], r["took2"]) for r in runs)
        left = max(r["nolib_took1"] - r["nolib_back1"] for r in runs)
        so_left = max(r["so_left1"] for r in runs)
        verdicts.append(
            f"{kind:<7} {'met' if first >= GOAL else 'NOT met':<8} worst first unload {first:4.0%} without .so "
            f"(leaves {left:4.1f} MiB); whole RSS {whole:4.0%} (.so pages left {so_left:4.1f} MiB); "
            f"second unload {second:4.0%}"
        )
        print()
    print(
        f"goal: unload gives back at least {GOAL:.0%} of the RSS the build took (without .so pages, worst run)"
    )
    print("per model, the worst of its runs:")
    print("\n".join(verdicts))
    print(f"\n{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
