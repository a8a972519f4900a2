"""Fork safety (issue 5): a forked child never inherits a model, a held lock or a thread."""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lazyenc import EncoderManager, parse_config
from lazyenc.testing import FakeLoader, make_settings

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def in_child(body: Callable[[], dict[str, Any]], *, timeout: float = 120.0) -> dict[str, Any]:
    """Run ``body`` in a forked child and return what it reports through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            os.close(read_end)
            report = body()
        except BaseException as exc:
            report, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
        try:
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_end], [], [], 0.5)
        if ready:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read_end)
        raise AssertionError("the forked child did not answer (hung on an inherited lock?)")
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    report = json.loads(b"".join(chunks) or b"{}")
    assert 0 == os.waitstatus_to_exitcode(status), report
    return report


def test_child_sees_idle_and_builds_its_own_model() -> None:
    """A loaded fake encoder is idle in the child, which builds a new model on first use."""
    loader = FakeLoader()
    with EncoderManager(make_settings({"a": "dense"}), loaders={"dense": loader}) as mgr:
        parent_model = mgr["a"].load()

        def child() -> dict[str, Any]:
            before = mgr["a"].status()
            mgr["a"].encode(["x"])
            return {
                "state": before.state,
                "loaded": before.loaded,
                "builds": loader.builds,
                "same_model": mgr["a"].peek() is parent_model,
            }

        report = in_child(child)
        assert {"state": "idle", "loaded": False, "builds": 2, "same_model": False} == report
        assert ("loaded", 1) == (mgr["a"].state, loader.builds)  # the parent keeps its model


def test_child_gets_fresh_locks_when_the_parent_forked_during_a_build() -> None:
    """A build holding its lock in another parent thread at fork time does not block the child."""
    gate = threading.Event()
    loader = FakeLoader(gate=gate)
    with EncoderManager(make_settings({"a": "dense"}), loaders={"dense": loader}) as mgr:
        worker = threading.Thread(target=mgr["a"].load)
        worker.start()
        assert loader.started.wait(60)
        assert "loading" == mgr["a"].state
        loader.gate = None  # the child's own build must not wait for the parent's event

        def child() -> dict[str, Any]:
            state = mgr["a"].state
            mgr["a"].encode(["x"])
            return {"state": state, "after": mgr["a"].state}

        report = in_child(child)
        gate.set()
        worker.join()
        assert {"state": "idle", "after": "loaded"} == report


def test_child_has_no_reaper_thread_and_starts_its_own_when_needed() -> None:
    """The parent's idle reaper does not exist in the child; the child's own timer still unloads."""
    text = """
    [encoders.a]
    kind = "dense"
    model = "fake"
    idle_unload_s = 600
    [encoders.b]
    kind = "dense"
    model = "fake"
    idle_unload_s = 0.05
    """
    with EncoderManager(parse_config(text), loaders={"dense": FakeLoader()}) as mgr:
        mgr["a"].encode(["x"])
        assert any(t.name.endswith("idle-reaper") for t in threading.enumerate())

        def child() -> dict[str, Any]:
            threads = sorted(t.name for t in threading.enumerate())
            deadline_after_fork = mgr["a"].status().idle_unload_at
            mgr["b"].encode(["x"])
            stop = time.monotonic() + 60
            while mgr["b"].state != "idle" and time.monotonic() < stop:
                time.sleep(0.02)
            return {"threads": threads, "deadline": deadline_after_fork, "b": mgr["b"].state}

        report = in_child(child)
        assert {"threads": ["MainThread"], "deadline": None, "b": "idle"} == report


@pytest.mark.real
def test_child_builds_its_own_real_model_after_the_parent_loaded_one() -> None:
    """With MiniLM run in the parent, the child starts idle, on one torch thread, and encodes with its own."""
    text = (ROOT / "config.example.toml").read_text()
    with EncoderManager(parse_config(text, base_dir=str(ROOT))) as mgr:
        parent = mgr["dense"].encode("hello")

        def child() -> dict[str, Any]:
            import torch

            threads = torch.get_num_threads()
            state = mgr["dense"].state
            vector = mgr["dense"].encode("hello")
            return {
                "state": state,
                "dim": len(vector),
                "same": bool(abs(vector - parent).max() < 1e-5),
                "threads": threads,
            }

        report = in_child(child)
        assert {"state": "idle", "dim": 384, "same": True, "threads": 1} == report
