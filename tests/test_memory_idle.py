"""Idle unload (issue 5): the timer starts when the last call ends and never fires during one."""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path

import pytest

from lazyenc import EncoderManager, parse_config
from lazyenc.testing import FakeLoader, FakeModel, make_settings
from tests._polling import wait_for

ROOT = Path(__file__).resolve().parent.parent


def reaper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("idle-reaper")]


@pytest.mark.real
def test_real_dense_model_unloads_after_idle_timeout_and_builds_again_on_next_call() -> None:
    """The packaged MiniLM is freed once idle_unload_s passes, and the next call builds it again."""
    text = (ROOT / "config.example.toml").read_text()
    text = text.replace('kind = "dense"\n', 'kind = "dense"\nidle_unload_s = 0.5\n', 1)
    with EncoderManager(parse_config(text, base_dir=str(ROOT))) as mgr:
        dense = mgr["dense"]
        assert (384,) == dense.encode("hello").shape
        assert dense.status().idle_unload_at is not None
        model = weakref.ref(dense.peek())
        assert wait_for(lambda: dense.state == "idle")
        assert (None, None) == (dense.peek(), model())  # no reference left anywhere
        assert dense.status().idle_unload_at is None
        assert (384,) == dense.encode("hello again").shape
        assert "loaded" == dense.state
        assert "idle" == mgr["rerank"].state  # no idle_unload_s there: never built, never timed


def test_idle_unload_never_happens_during_a_call_that_outlives_the_timeout() -> None:
    """A slow call held by an event keeps its model past the timeout; the timer starts when it ends."""
    gate = threading.Event()
    model = FakeModel(gate=gate)
    loader = FakeLoader(model_factory=lambda: model)
    with EncoderManager(make_settings({"a": "dense"}, idle_unload_s=0.05), loaders={"dense": loader}) as mgr:
        proxy = mgr["a"]
        worker = threading.Thread(target=proxy.encode, args=(["slow"],))
        worker.start()
        assert wait_for(lambda: model.calls == 1)
        time.sleep(0.3)  # six timeouts pass while the call is running
        status = proxy.status()
        assert ("loaded", 1, None) == (status.state, status.in_flight, status.idle_unload_at)
        gate.set()
        worker.join()
        assert wait_for(lambda: proxy.state == "idle")
        assert 1 == loader.builds


def test_each_call_pushes_the_idle_deadline_later() -> None:
    """A call resets the timer: the deadline after the second call is later than after the first."""
    loader = FakeLoader()
    with EncoderManager(make_settings({"a": "dense"}, idle_unload_s=600), loaders={"dense": loader}) as mgr:
        mgr["a"].encode(["one"])
        first = mgr["a"].status().idle_unload_at
        time.sleep(0.01)
        mgr["a"].encode(["two"])
        second = mgr["a"].status().idle_unload_at
        assert first is not None and second is not None
        assert second > first
        assert first == pytest.approx(time.time() + 600, abs=5)


def test_encoder_setting_overrides_the_hardware_default() -> None:
    """idle_unload_s on an encoder wins over [hardware].idle_unload_s, and 0 there means never."""
    text = """
    [hardware]
    idle_unload_s = 600
    [encoders.timed]
    kind = "dense"
    model = "fake"
    [encoders.never]
    kind = "dense"
    model = "fake"
    idle_unload_s = 0
    [encoders.short]
    kind = "dense"
    model = "fake"
    idle_unload_s = 0.05
    """
    with EncoderManager(parse_config(text), loaders={"dense": FakeLoader()}) as mgr:
        for name in mgr:
            mgr[name].encode(["x"])
        assert mgr["timed"].status().idle_unload_at is not None
        assert mgr["never"].status().idle_unload_at is None
        assert wait_for(lambda: mgr["short"].state == "idle")
        assert ["loaded", "loaded", "idle"] == [mgr[n].state for n in ("timed", "never", "short")]


def test_no_idle_timeout_starts_no_thread() -> None:
    """With idle_unload_s absent nothing is scheduled and no reaper thread exists."""
    before = set(reaper_threads())
    with EncoderManager(make_settings({"a": "dense"}), loaders={"dense": FakeLoader()}) as mgr:
        mgr["a"].encode(["x"])
        assert None is mgr["a"].status().idle_unload_at
        assert before == set(reaper_threads())


def test_a_warmed_up_model_that_is_never_called_unloads_too() -> None:
    """A build without calls (warmup) starts the idle timer as well."""
    with EncoderManager(
        make_settings({"a": "dense"}, idle_unload_s=0.05), loaders={"dense": FakeLoader()}
    ) as mgr:
        mgr.warmup("a")
        assert wait_for(lambda: mgr["a"].state == "idle")


def test_reaper_thread_exits_when_nothing_is_pending() -> None:
    """Once every timed encoder is unloaded the single reaper thread ends by itself."""
    before = set(reaper_threads())
    settings = make_settings({"a": "dense", "b": "dense"}, idle_unload_s=0.05)
    with EncoderManager(settings, loaders={"dense": FakeLoader()}) as mgr:
        mgr["a"].encode(["x"])
        mgr["b"].encode(["x"])
        assert 1 == len(set(reaper_threads()) - before)
        assert wait_for(lambda: mgr["a"].state == mgr["b"].state == "idle")
        assert wait_for(lambda: set(reaper_threads()) == before)


def test_calls_racing_a_tiny_idle_timeout_all_get_results() -> None:
    """With idle_unload_s = 1 ms, 8 threads x 50 calls all succeed while the reaper unloads between them."""
    loader = FakeLoader()
    results: list[object] = []
    lock = threading.Lock()
    with EncoderManager(make_settings({"a": "dense"}, idle_unload_s=0.001), loaders={"dense": loader}) as mgr:
        # Every 10 calls all threads stop together until the reaper has unloaded, so unloads
        # between calls happen however slow the machine is; in between, calls race the timer.
        pause = threading.Barrier(8, action=lambda: wait_for(lambda: mgr["a"].state == "idle"))

        def work() -> None:
            for i in range(50):
                try:
                    value: object = mgr["a"].encode([f"text {i}"])
                except Exception as exc:
                    value = exc
                with lock:
                    results.append(value)
                if i % 10 == 9:
                    pause.wait()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [] == [r for r in results if isinstance(r, Exception)]
        assert 400 == len(results)
        assert loader.builds > 1  # the reaper did unload between calls
        assert wait_for(lambda: mgr["a"].state == "idle")
        assert 0 == mgr["a"].status().in_flight
