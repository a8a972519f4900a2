"""Shutdown (issue 5): close(), interpreter exit and a host lifespan stop every lazyenc thread."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lazyenc import EncoderClosedError, EncoderManager
from lazyenc._memory import malloc_trim
from lazyenc.admin import lifespan
from lazyenc.testing import FakeLoader, make_settings

ROOT = Path(__file__).resolve().parent.parent


def lazyenc_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("lazyenc")}


def test_close_stops_the_reaper_thread() -> None:
    """After close() no thread started by the manager is left in threading.enumerate()."""
    before = set(threading.enumerate())
    settings = make_settings({"a": "dense", "b": "rerank"}, idle_unload_s=600)
    mgr = EncoderManager(settings, loaders={"dense": FakeLoader(), "rerank": FakeLoader()})
    mgr["a"].encode(["x"])
    mgr["b"].predict([("q", "d")])
    started = {t.name for t in set(threading.enumerate()) - before}
    assert {"lazyenc-idle-reaper", "lazyenc-batch-a", "lazyenc-batch-b"} == started
    mgr.close()
    assert set() == set(threading.enumerate()) - before
    assert [None, None] == [s.idle_unload_at for s in mgr.status()]
    with pytest.raises(EncoderClosedError):
        mgr["a"].encode(["x"])


def test_a_standalone_proxy_closes_its_own_reaper() -> None:
    """A proxy built without a manager has a private lifecycle that its close() stops."""
    from lazyenc import DenseProxy, EncoderSettings, HardwareSettings

    before = lazyenc_threads()
    proxy = DenseProxy(
        EncoderSettings(name="solo", kind="dense", model="fake", idle_unload_s=600),
        loader=FakeLoader(),
        hardware=HardwareSettings(device="cpu"),
    )
    proxy.encode(["x"])
    assert {"lazyenc-solo-idle-reaper", "lazyenc-batch-solo"} == {t.name for t in lazyenc_threads() - before}
    proxy.close()
    assert set() == lazyenc_threads() - before


def test_interpreter_exit_stops_the_reaper_thread() -> None:
    """At exit (no close() called) lazyenc's atexit hook stops the reaper and the batch worker."""
    script = """
import atexit, threading
# Registered before lazyenc's hook, so it runs after it (atexit is last in, first out).
atexit.register(lambda: print("left:", sorted(t.name for t in threading.enumerate())))
from lazyenc import EncoderManager
from lazyenc.testing import FakeLoader, make_settings
mgr = EncoderManager(make_settings({"a": "dense"}, idle_unload_s=600), loaders={"dense": FakeLoader()})
mgr["a"].encode(["x"])
print("running:", sorted(t.name for t in threading.enumerate()))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert 0 == done.returncode, done.stderr
    expected = "running: ['MainThread', 'lazyenc-batch-a', 'lazyenc-idle-reaper']\nleft: ['MainThread']\n"
    assert expected == done.stdout


def test_lifespan_closes_the_manager_when_the_host_stops() -> None:
    """lazyenc.admin.lifespan(mgr, warmup=True) is a Starlette lifespan: the manager is closed on exit."""
    mgr = EncoderManager(make_settings({"a": "dense"}), loaders={"dense": FakeLoader()})

    async def host() -> tuple[bool, str]:
        async with lifespan(mgr, warmup=True)(object()):
            during = (mgr.closed, mgr["a"].state)
        return during

    assert (False, "loaded") == asyncio.run(host())
    assert mgr.closed


def test_lifespan_runs_inside_a_starlette_app() -> None:
    """With Starlette's TestClient the lifespan really runs and closes the manager at shutdown."""
    starlette = pytest.importorskip("starlette.applications")
    from starlette.testclient import TestClient

    mgr = EncoderManager(make_settings({"a": "dense"}), loaders={"dense": FakeLoader()})
    app = starlette.Starlette(lifespan=lifespan(mgr))
    with TestClient(app):
        assert not mgr.closed
    assert mgr.closed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_malloc_trim_is_reached_through_ctypes_on_glibc() -> None:
    """On Linux with glibc, malloc_trim(0) is found and called."""
    assert malloc_trim()


def test_unload_gives_a_large_model_allocation_back() -> None:
    """A fake model holding 200 MiB of small blocks in a reference cycle is given back by unload()."""
    from lazyenc._process import rss_bytes

    class Cyclic:
        def __init__(self) -> None:
            self.me = self  # only gc.collect() frees it
            # 4 KiB blocks live on the malloc heap, not in mmap regions of their own.
            self.chunks = [bytes([i % 256]) * 4096 for i in range(50_000)]

        def encode(self, texts: list[str], **kwargs: object) -> list[int]:
            return [len(t) for t in texts]

    mgr = EncoderManager(make_settings({"a": "dense"}), loaders={"dense": FakeLoader(model_factory=Cyclic)})
    before = rss_bytes()
    mgr["a"].encode(["x"])
    loaded = rss_bytes()
    mgr.unload("a")
    after = rss_bytes()
    assert before is not None and loaded is not None and after is not None
    assert loaded - before > 150 * 2**20
    assert (loaded - after) / (loaded - before) > 0.75
