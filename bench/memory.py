"""How much RSS does unload() give back? (issue 5)

For each packaged model (dense, rerank, sparse, spacy), in a fresh process, after
its library is imported: RSS before the build, after the build and some calls,
and after unload(); then a second build and unload in the same process. RSS
is also shown without the pages of shared libraries (``*.so`` mappings in
/proc/self/smaps): the first build and the first calls touch library code
(libtorch kernels, the tokenizers extension) once, and no unload can or needs
to give those clean, shared pages back. Each
model runs twice: with lazyenc's unload (del, gc.collect, malloc_trim(0)) and
with del + gc.collect only (malloc_trim disabled).

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 python bench/memory.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("dense", "rerank", "sparse", "spacy")
MIB = 2**20


def measure(kind: str, trim: bool) -> dict[str, float]:
    """Runs in the fresh child process."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if kind == "spacy":
        import spacy  # noqa: F401
    else:
        import sentence_transformers  # noqa: F401

    from lazyenc import EncoderManager, _memory, parse_config
    from lazyenc._process import rss_bytes

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

    def rss() -> tuple[int, int]:
        """(RSS, RSS without shared-library pages): code pages touched once are no model memory."""
        total = rss_bytes()
        assert total is not None
        libraries = 0
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
            in_library = False
            for line in f:
                head = line.split(maxsplit=6)
                if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
                    in_library = len(head) > 5 and ".so" in head[5]
                elif in_library and line.startswith("Rss:"):
                    libraries += int(head[1]) * 1024
        return total, total - libraries

    out: dict[str, float] = {}
    for cycle in (1, 2):
        before = rss()
        proxy.load()
        use()
        loaded = rss()
        proxy.unload()
        after = rss()
        out[f"took{cycle}"] = (loaded[0] - before[0]) / MIB
        out[f"back{cycle}"] = (loaded[0] - after[0]) / MIB
        out[f"nolib_took{cycle}"] = (loaded[1] - before[1]) / MIB
        out[f"nolib_back{cycle}"] = (loaded[1] - after[1]) / MIB
    mgr.close()
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2], sys.argv[3] == "trim")))
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    header = (
        f"{'model':<7} {'unload does':<12} | {'1st build+calls: RSS took':>25} {'back':>6} {'share':>6}"
        f" | {'no .so: took':>9} {'back':>6} {'share':>6} | {'2nd cycle: took':>15} {'back':>6} {'share':>6}"
    )
    print(header)
    print("-" * len(header))
    results: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        for mode in ("trim", "gc"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, mode],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(done.stdout.strip().splitlines()[-1])
            if mode == "trim":
                results[kind] = r
            label = "del+gc+trim" if mode == "trim" else "del+gc only"
            print(
                f"{kind:<7} {label:<12} | {r['took1']:>21.1f} MiB {r['back1']:>6.1f} "
                f"{r['back1'] / r['took1']:>6.0%} | {r['nolib_took1']:>12.1f} {r['nolib_back1']:>6.1f} "
                f"{r['nolib_back1'] / r['nolib_took1']:>6.0%} | {r['took2']:>15.1f} {r['back2']:>6.1f} "
                f"{r['back2'] / r['took2']:>6.0%}",
                flush=True,
            )

    # The first build in a process also pays for one-time library state (code pages,
    # modules, caches) that the second build reuses: its RSS cost is the model's own.
    print("\nfirst unload (del+gc+trim) against the model's own RSS, measured by the second build:")
    for kind, r in results.items():
        print(
            f"{kind:<7} first build took {r['took1']:5.1f} MiB, of which one-time library state "
            f"{r['took1'] - r['took2']:5.1f}; the model's own {r['took2']:5.1f} MiB; "
            f"the first unload gave back {r['back1']:5.1f} MiB = {r['back1'] / r['took2']:.0%} of it"
        )


if __name__ == "__main__":
    main()
