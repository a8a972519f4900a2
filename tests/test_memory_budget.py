"""The memory budget (issue 5): LRU eviction of idle encoders, MemoryBudgetError when nothing fits."""

from __future__ import annotations

import threading

import pytest

from lazyenc import EncoderManager, MemoryBudgetError
from lazyenc.testing import FakeLoader, FakeModel, make_settings
from tests._polling import wait_for

MIB = 2**20


class Payload(FakeModel):
    """A fake model that really occupies ``size`` bytes of RSS."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.payload = b"\x01" * size  # written, so resident


def test_max_loaded_evicts_the_least_recently_used_encoder() -> None:
    """With max_loaded = 2, building a third unloads the one used longest ago."""
    settings = make_settings({"a": "dense", "b": "dense", "c": "dense"}, max_loaded=2)
    with EncoderManager(settings, loaders={"dense": FakeLoader()}) as mgr:
        mgr["a"].encode(["x"])
        mgr["b"].encode(["x"])
        mgr["a"].encode(["x"])  # a is now more recent than b
        mgr["c"].encode(["x"])
        assert ["loaded", "idle", "loaded"] == [mgr[n].state for n in "abc"]
        mgr["b"].encode(["x"])  # a is now the least recently used
        assert ["idle", "loaded", "loaded"] == [mgr[n].state for n in "abc"]


def test_a_budget_too_small_raises_and_does_not_disable_the_encoder() -> None:
    """A build over memory_budget_mb raises MemoryBudgetError naming need and budget; state stays idle."""
    loader = FakeLoader(weight_bytes=10 * MIB)
    settings = make_settings({"big": "dense"}, memory_budget_mb=1)
    with EncoderManager(settings, loaders={"dense": loader}) as mgr:
        with pytest.raises(MemoryBudgetError) as info:
            mgr["big"].encode(["x"])
        message = str(info.value)
        assert "'big' needs about 10 MiB" in message
        assert "memory_budget_mb = 1" in message
        assert (10 * MIB, "idle", 0) == (info.value.needed_bytes, mgr["big"].state, loader.builds)
        # The refusal stays visible (a panel's background load has no caller to raise to).
        status = mgr.status()[0]
        assert status.reason == mgr["big"].reason == f"last build refused: {message}"


def test_a_refused_build_keeps_its_reason_until_a_build_succeeds() -> None:
    """Once room is made, the next build succeeds and the refusal's reason is cleared."""
    gate = threading.Event()
    busy = FakeModel(gate=gate)
    settings = make_settings({"a": "dense", "b": "rerank"}, max_loaded=1)
    loaders = {"dense": FakeLoader(model_factory=lambda: busy), "rerank": FakeLoader()}
    with EncoderManager(settings, loaders=loaders) as mgr:
        worker = threading.Thread(target=mgr["a"].encode, args=(["slow"],))
        worker.start()
        assert wait_for(lambda: busy.calls == 1)
        with pytest.raises(MemoryBudgetError):
            mgr["b"].predict([("q", "d")])
        assert mgr["b"].reason.startswith("last build refused: ")
        gate.set()
        worker.join()
        mgr["b"].predict([("q", "d")])
        assert ("idle", "loaded", "") == (mgr["a"].state, mgr["b"].state, mgr["b"].reason)


def test_an_encoder_in_use_is_never_evicted() -> None:
    """max_loaded = 1 and a call in flight on a: building b fails, naming a; after the call b evicts a."""
    gate = threading.Event()
    busy = FakeModel(gate=gate)
    slow = FakeLoader(model_factory=lambda: busy)
    settings = make_settings({"a": "dense", "b": "rerank"}, max_loaded=1)
    with EncoderManager(settings, loaders={"dense": slow, "rerank": FakeLoader()}) as mgr:
        worker = threading.Thread(target=mgr["a"].encode, args=(["slow"],))
        worker.start()
        assert wait_for(lambda: busy.calls == 1)
        with pytest.raises(MemoryBudgetError, match=r"max_loaded = 1 .*a \(loaded, 1 in flight"):
            mgr["b"].predict([("q", "d")])
        assert ("loaded", "idle") == (mgr["a"].state, mgr["b"].state)
        gate.set()
        worker.join()
        assert [1.0] == mgr["b"].predict([("q", "q")])
        assert ("idle", "loaded") == (mgr["a"].state, mgr["b"].state)


def test_an_encoder_still_loading_is_never_evicted() -> None:
    """A build in progress counts against max_loaded and cannot be evicted."""
    gate = threading.Event()
    slow = FakeLoader(gate=gate)
    settings = make_settings({"a": "dense", "b": "rerank"}, max_loaded=1)
    with EncoderManager(settings, loaders={"dense": slow, "rerank": FakeLoader()}) as mgr:
        worker = threading.Thread(target=mgr["a"].encode, args=(["x"],))
        worker.start()
        assert slow.started.wait(60)
        with pytest.raises(MemoryBudgetError, match=r"a \(loading"):
            mgr["b"].predict([("q", "d")])
        gate.set()
        worker.join()
        assert "loaded" == mgr["a"].state


def test_after_an_unload_the_estimate_is_the_rss_its_last_build_took() -> None:
    """Weights on disk are the first guess; once built, the measured RSS change is used, even after unload."""
    settings = make_settings({"a": "dense", "b": "rerank"}, memory_budget_mb=60)
    loaders = {
        "dense": FakeLoader(weight_bytes=1000, model_factory=lambda: Payload(40 * MIB)),
        "rerank": FakeLoader(weight_bytes=1000, model_factory=lambda: Payload(40 * MIB)),
    }
    with EncoderManager(settings, loaders=loaders) as mgr:
        mgr["a"].encode(["x"])
        measured = mgr["a"].status().rss_delta_bytes
        assert measured is not None and measured > 30 * MIB
        mgr.unload("a")
        assert measured == mgr["a"].status().rss_delta_bytes
        mgr["b"].predict([("q", "d")])  # guessed at 1000 bytes: fits next to nothing
        mgr["a"].encode(["x"])  # ~40 MiB measured + b's ~40 MiB > 60 MiB: b goes
        assert ("loaded", "idle") == (mgr["a"].state, mgr["b"].state)


def test_concurrent_builds_under_max_loaded_one_never_deadlock() -> None:
    """Threads building different encoders under max_loaded = 1 each get a result or MemoryBudgetError."""
    names = ["a", "b", "c", "d"]
    settings = make_settings(dict.fromkeys(names, "dense"), max_loaded=1)
    outcomes: list[str] = []
    lock = threading.Lock()

    with EncoderManager(settings, loaders={"dense": FakeLoader(build_delay_s=0.01)}) as mgr:

        def hammer(name: str) -> None:
            for _ in range(20):
                try:
                    mgr[name].encode(["x"])
                    result = "ok"
                except MemoryBudgetError:
                    result = "budget"
                with lock:
                    outcomes.append(result)

        threads = [threading.Thread(target=hammer, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert 80 == len(outcomes)
        assert "ok" in outcomes
        assert 1 >= sum(p.loaded for p in mgr.proxies())
        assert all(p.state in ("idle", "loaded") for p in mgr.proxies())


def test_eager_warmup_respects_max_loaded() -> None:
    """With lazy_encoders = false and max_loaded = 2, warm-up of three leaves the last two built."""
    settings = make_settings({"a": "dense", "b": "dense", "c": "dense"}, max_loaded=2, lazy_encoders=False)
    loader = FakeLoader()
    with EncoderManager(settings, loaders={"dense": loader}) as mgr:
        assert (["idle", "loaded", "loaded"], 3) == ([mgr[n].state for n in "abc"], loader.builds)


def test_manager_memory_reports_budget_and_estimates_without_loading() -> None:
    """mgr.memory() shows the budget, what is loaded and its estimated cost."""
    settings = make_settings({"a": "dense", "b": "dense"}, max_loaded=2, memory_budget_mb=5)
    with EncoderManager(settings, loaders={"dense": FakeLoader(weight_bytes=MIB)}) as mgr:
        assert {
            "max_loaded": 2,
            "memory_budget_bytes": 5 * MIB,
            "loaded": [],
            "estimated_bytes": 0,
            "reaper_running": False,
            "malloc_arena_max": None,
        } == mgr.memory()
        mgr["b"].encode(["x"])
        assert (["b"], "idle") == (mgr.memory()["loaded"], mgr["a"].state)
        assert mgr.memory()["estimated_bytes"] > 0


def test_nothing_is_evicted_when_the_build_could_not_fit_anyway() -> None:
    """A build bigger than the whole budget raises without unloading the idle encoders."""
    settings = make_settings({"small": "dense", "huge": "rerank"}, memory_budget_mb=5)
    loaders = {"dense": FakeLoader(weight_bytes=MIB), "rerank": FakeLoader(weight_bytes=50 * MIB)}
    with EncoderManager(settings, loaders=loaders) as mgr:
        mgr["small"].encode(["x"])
        with pytest.raises(MemoryBudgetError, match="nothing else is in use"):
            mgr["huge"].predict([("q", "d")])
        assert ("loaded", "idle") == (mgr["small"].state, mgr["huge"].state)
