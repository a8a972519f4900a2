"""[hardware] malloc_arena_max: threads created afterwards share glibc's heaps instead of each getting one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lazyenc import EncoderManager
from lazyenc.testing import FakeLoader, make_settings

ROOT = Path(__file__).resolve().parent.parent

# Counts glibc's per-thread heaps: each is a 64 MiB-aligned anonymous reservation in
# /proc/self/maps (the part not yet used is mapped ---p). A thread that allocates
# gets a new one unless the arena limit makes it share.
CHILD = textwrap.dedent(
    """
    import sys, threading
    from lazyenc import EncoderManager
    from lazyenc.testing import FakeLoader, make_settings

    def heaps():
        starts = set()
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                start = int(fields[0].split("-")[0], 16)
                if len(fields) == 5 and start % (64 << 20) == 0:
                    starts.add(start)
        return len(starts)

    limit = None if sys.argv[1] == "none" else int(sys.argv[1])
    settings = make_settings({"a": "dense"}, malloc_arena_max=limit)
    mgr = EncoderManager(settings, loaders={"dense": FakeLoader()})
    mgr["a"].encode(["x"])  # the first build applies the limit
    before = heaps()
    def allocate():
        blocks = [bytearray(200_000) for _ in range(20)]  # above pymalloc: glibc malloc
        del blocks
    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(heaps() - before, mgr.memory()["malloc_arena_max"])
    """
)


def run_child(limit: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, limit],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    new_heaps, reported = done.stdout.split()
    return int(new_heaps), reported


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_with_one_arena_new_threads_get_no_heap_of_their_own() -> None:
    """Four allocating threads add heaps by default, none with malloc_arena_max = 1."""
    default_heaps, default_reported = run_child("none")
    limited_heaps, limited_reported = run_child("1")
    assert default_heaps >= 1, "glibc gave the threads no heap of their own: the test shows nothing"
    assert (0, "1") == (limited_heaps, limited_reported)
    assert "None" == default_reported


def test_the_limit_is_applied_at_the_first_build_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not at init (no ctypes there): the first build calls mallopt with the limit, later ones do not."""
    from lazyenc import _memory

    calls: list[int] = []
    monkeypatch.setattr(_memory, "limit_malloc_arenas", lambda n: calls.append(n) or True)
    settings = make_settings({"a": "dense", "b": "dense"}, malloc_arena_max=2)
    with EncoderManager(settings, loaders={"dense": FakeLoader()}) as mgr:
        assert ([], None) == (calls, mgr.memory()["malloc_arena_max"])
        mgr["a"].encode(["x"])
        mgr["b"].encode(["x"])
        assert ([2], 2) == (calls, mgr.memory()["malloc_arena_max"])
    with EncoderManager(make_settings({"a": "dense"}), loaders={"dense": FakeLoader()}) as mgr:
        mgr["a"].encode(["x"])
        assert [2] == calls
