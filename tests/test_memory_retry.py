"""retry_after_s (issue 5): a disabled encoder gets exactly one new build once the delay passed."""

from __future__ import annotations

import threading
import time

import pytest

from lazyenc import EncoderLoadError, EncoderManager, parse_config
from lazyenc.testing import FakeLoader

CONFIG = """
[encoders.flaky]
kind = "dense"
model = "fake"
{extra}
"""


def hammer(call, n: int = 16) -> list[object]:
    """Run ``call`` from ``n`` threads released together; collect results or exceptions."""
    barrier = threading.Barrier(n)
    results: list[object] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        try:
            value: object = call()
        except Exception as exc:
            value = exc
        with lock:
            results.append(value)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def wait_until_epoch(at: float) -> None:
    while time.time() < at:
        time.sleep(0.01)


def test_after_retry_after_s_many_threads_trigger_exactly_one_build() -> None:
    """Once due, 16 concurrent calls cause one rebuild, and all of them get vectors."""
    loader = FakeLoader(fail=OSError("disk hiccup"))
    with EncoderManager(
        parse_config(CONFIG.format(extra="retry_after_s = 0.2")), loaders={"dense": loader}
    ) as mgr:
        with pytest.raises(EncoderLoadError, match="OSError: disk hiccup"):
            mgr["flaky"].encode(["x"])
        with pytest.raises(EncoderLoadError):
            mgr["flaky"].encode(["x"])  # not due yet: no build
        assert 1 == loader.builds
        retry_at = mgr["flaky"].status().retry_at
        assert retry_at is not None
        loader.fail = None
        wait_until_epoch(retry_at + 0.05)
        results = hammer(lambda: mgr["flaky"].encode(["x"]))
        assert 2 == loader.builds
        assert [False] * 16 == [isinstance(r, Exception) for r in results]
        assert 1 == len({repr(r) for r in results})
        assert ("loaded", None) == (mgr["flaky"].state, mgr["flaky"].status().retry_at)


def test_a_retry_that_fails_again_is_one_build_and_waits_another_delay() -> None:
    """A failing retry is built once for all concurrent callers, who all get EncoderLoadError."""
    loader = FakeLoader(fail=OSError("still broken"))
    with EncoderManager(
        parse_config(CONFIG.format(extra="retry_after_s = 0.2")), loaders={"dense": loader}
    ) as mgr:
        with pytest.raises(EncoderLoadError):
            mgr["flaky"].encode(["x"])
        first = mgr["flaky"].status().retry_at
        assert first is not None
        wait_until_epoch(first + 0.05)
        results = hammer(lambda: mgr["flaky"].encode(["x"]))
        assert 2 == loader.builds
        assert [True] * 16 == [isinstance(r, EncoderLoadError) for r in results]
        second = mgr["flaky"].status().retry_at
        assert second is not None and second > first


def test_without_retry_after_s_a_disabled_encoder_stays_disabled_until_reset() -> None:
    """No retry_after_s: no retry time, later calls build nothing; reset() allows one build."""
    loader = FakeLoader(fail=OSError("broken"))
    with EncoderManager(parse_config(CONFIG.format(extra="")), loaders={"dense": loader}) as mgr:
        with pytest.raises(EncoderLoadError):
            mgr["flaky"].encode(["x"])
        loader.fail = None
        time.sleep(0.1)
        with pytest.raises(EncoderLoadError):
            mgr["flaky"].encode(["x"])
        assert (1, None) == (loader.builds, mgr["flaky"].status().retry_at)
        mgr.reset("flaky")
        mgr["flaky"].encode(["x"])
        assert 2 == loader.builds
