"""Build once, cache failures, reset, eager mode: shown with counting fakes."""

from __future__ import annotations

import pickle
import threading

import pytest

import lazyenc
from lazyenc import EncoderLoadError, EncoderManager, EncoderUnavailableError, UnknownEncoderError
from lazyenc.testing import FakeLoader, make_settings


def manager(loader: FakeLoader, kind: str = "dense", **hardware: object) -> EncoderManager:
    return EncoderManager(make_settings({"enc": kind}, **hardware), loaders={"enc": loader})  # type: ignore[arg-type]


def run_threads(n: int, target) -> list[object]:  # type: ignore[no-untyped-def]
    results: list[object] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target()
        except Exception as exc:  # collected for the assertions
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_init_builds_nothing() -> None:
    """A lazy manager probes but does not build."""
    loader = FakeLoader()
    mgr = manager(loader)
    assert 0 == loader.builds
    assert "idle" == mgr["enc"].state
    assert mgr["enc"].peek() is None
    assert not mgr["enc"].loaded


def test_first_call_builds_exactly_once_under_32_threads() -> None:
    """32 threads arriving together on first use cause one build and all get results."""
    gate = threading.Event()
    loader = FakeLoader(gate=gate)
    proxy = manager(loader)["enc"]
    threading.Timer(0.05, gate.set).start()
    results = run_threads(32, lambda: proxy.encode(["hello"]))
    assert 1 == loader.builds
    assert all(isinstance(r, list) and len(r) == 1 for r in results)
    assert "loaded" == proxy.state
    assert 32 == proxy.status().calls


def test_failed_build_is_cached_as_disabled_with_reason() -> None:
    """A failed build disables the encoder; later callers get EncoderLoadError without a rebuild."""
    loader = FakeLoader(fail=OSError("weights are corrupt"))
    proxy = manager(loader)["enc"]
    with pytest.raises(EncoderLoadError) as first:
        proxy.encode(["x"])
    assert isinstance(first.value.__cause__, OSError)
    results = run_threads(16, lambda: proxy.encode(["x"]))
    assert 1 == loader.builds
    assert all(isinstance(r, EncoderLoadError) for r in results)
    assert "disabled" == proxy.state
    assert "OSError: weights are corrupt" == proxy.reason
    assert "weights are corrupt" in str(results[0])


def test_concurrent_first_calls_share_one_failed_build() -> None:
    """Threads that queue behind a failing build all see the failure; only one build runs."""
    gate = threading.Event()
    loader = FakeLoader(gate=gate, fail=RuntimeError("boom"))
    proxy = manager(loader)["enc"]
    threading.Timer(0.05, gate.set).start()
    results = run_threads(32, lambda: proxy.encode(["x"]))
    assert 1 == loader.builds
    assert all(isinstance(r, EncoderLoadError) for r in results)


def test_reset_allows_exactly_one_new_build() -> None:
    """After reset, one build runs again even with many threads; success clears the reason."""
    loader = FakeLoader(fail=RuntimeError("boom"))
    mgr = manager(loader)
    with pytest.raises(EncoderLoadError):
        mgr["enc"].encode(["x"])
    loader.fail = None
    mgr.reset("enc")
    assert "idle" == mgr["enc"].state
    assert "" == mgr["enc"].reason
    results = run_threads(16, lambda: mgr["enc"].encode(["x"]))
    assert 2 == loader.builds
    assert all(isinstance(r, list) for r in results)


def test_unload_then_call_builds_again() -> None:
    """unload() drops the model; the next call builds a fresh one."""
    loader = FakeLoader()
    mgr = manager(loader)
    mgr["enc"].encode(["x"])
    assert mgr.unload("enc") is True
    assert mgr.unload("enc") is False
    assert "idle" == mgr["enc"].state
    mgr["enc"].encode(["x"])
    assert 2 == loader.builds


def test_model_errors_propagate_unchanged_and_are_counted() -> None:
    """An exception from the model's own code is not wrapped, and the encoder stays loaded."""
    boom = ValueError("bad tensor shape")
    loader = FakeLoader()
    proxy = manager(loader)["enc"]
    proxy.load().fail = boom
    with pytest.raises(ValueError) as info:
        proxy.encode(["x"])
    assert boom is info.value
    assert "loaded" == proxy.state
    assert 1 == proxy.status().errors


def test_unavailable_encoder_raises_with_the_reason() -> None:
    """A failed probe gives 'unavailable'; calls raise EncoderUnavailableError and never build."""
    loader = FakeLoader(available=False, reason="sentence-transformers is not installed")
    proxy = manager(loader)["enc"]
    assert "unavailable" == proxy.state
    with pytest.raises(EncoderUnavailableError, match="not installed"):
        proxy.encode(["x"])
    assert 0 == loader.builds


def test_one_failing_encoder_leaves_the_others_working() -> None:
    """A disabled encoder does not affect its neighbours."""
    bad, good = FakeLoader(fail=RuntimeError("no")), FakeLoader()
    mgr = EncoderManager(make_settings({"bad": "dense", "good": "dense"}), loaders={"bad": bad, "good": good})
    with pytest.raises(EncoderLoadError):
        mgr["bad"].encode(["x"])
    assert 1 == len(mgr["good"].encode(["x"]))
    assert ("disabled", "loaded") == (mgr["bad"].state, mgr["good"].state)


def test_eager_mode_builds_everything_and_never_raises() -> None:
    """lazy_encoders = false builds every available encoder at init; a failure only disables."""
    good, bad, missing = FakeLoader(), FakeLoader(fail=RuntimeError("broken")), FakeLoader(available=False)
    mgr = EncoderManager(
        make_settings({"good": "dense", "bad": "rerank", "missing": "sparse"}, lazy_encoders=False),
        loaders={"good": good, "bad": bad, "missing": missing},
    )
    assert {"good": "loaded", "bad": "disabled", "missing": "unavailable"} == {
        s.name: s.state for s in mgr.status()
    }
    assert (1, 1, 0) == (good.builds, bad.builds, missing.builds)
    assert mgr.eager_warmup_done


def test_environment_override_turns_eager_mode_on(write_toml) -> None:  # type: ignore[no-untyped-def]
    """LAZYENC_LAZY_ENCODERS=0 makes from_toml build at init."""
    loader = FakeLoader()
    path = write_toml("[encoders.enc]\nkind = 'dense'\nmodel = 'fake'\n")
    mgr = EncoderManager.from_toml(path, environ={"LAZYENC_LAZY_ENCODERS": "0"}, loaders={"enc": loader})
    assert 1 == loader.builds
    assert "loaded" == mgr["enc"].state


def test_warmup_builds_named_or_all_and_reports_times() -> None:
    """warmup() builds every available encoder; with names, only those, raising a failure."""
    a, b = FakeLoader(), FakeLoader(fail=RuntimeError("nope"))
    mgr = EncoderManager(make_settings({"a": "dense", "b": "dense"}), loaders={"a": a, "b": b})
    statuses = mgr.warmup()
    assert {"a": "loaded", "b": "disabled"} == {s.name: s.state for s in statuses}
    assert statuses[0].load_seconds is not None
    with pytest.raises(EncoderLoadError):
        mgr.warmup("b")
    with pytest.raises(UnknownEncoderError, match="configured: a, b"):
        mgr.warmup("c")


def test_unknown_name_lists_the_configured_ones() -> None:
    """mgr['x'] names the encoders that exist; membership, iteration and len work."""
    mgr = EncoderManager(
        make_settings({"a": "dense", "b": "spacy"}), loaders={"dense": FakeLoader(), "spacy": FakeLoader()}
    )
    with pytest.raises(UnknownEncoderError) as info:
        mgr["x"]
    assert "no encoder named 'x'; configured: a, b" == str(info.value)
    assert isinstance(info.value, KeyError)
    assert ("a" in mgr, "x" in mgr, list(mgr), len(mgr)) == (True, False, ["a", "b"], 2)


def test_close_unloads_and_refuses_later_calls() -> None:
    """Leaving the with block closes the manager: models dropped, calls refused."""
    loader = FakeLoader()
    with manager(loader) as mgr:
        mgr["enc"].encode(["x"])
    assert mgr["enc"].peek() is None
    with pytest.raises(lazyenc.EncoderClosedError):
        mgr["enc"].encode(["x"])


def test_status_and_repr_never_build() -> None:
    """status(), repr() and peek() leave a lazy encoder idle."""
    loader = FakeLoader()
    mgr = manager(loader)
    status = mgr.status()[0]
    assert ("enc", "dense", "idle", False, 8, 0) == (
        status.name,
        status.kind,
        status.state,
        status.loaded,
        status.dimension,
        status.calls,
    )
    assert "<DenseProxy 'enc' state=idle>" == repr(mgr["enc"])
    assert 0 == loader.builds
    assert set(status.as_dict()) >= {
        "name",
        "kind",
        "model",
        "state",
        "loaded",
        "reason",
        "device",
        "dimension",
        "max_seq_length",
        "revision",
        "weight_bytes",
        "load_seconds",
        "loaded_at",
        "last_used_at",
        "calls",
        "errors",
    }


def test_status_shows_loading_while_the_build_is_held() -> None:
    """During a build, status() answers at once with 'loading' and how long it has run."""
    gate = threading.Event()
    loader = FakeLoader(gate=gate)
    proxy = manager(loader)["enc"]
    t = threading.Thread(target=proxy.load)
    t.start()
    assert loader.started.wait(5)
    status = proxy.status()
    gate.set()
    t.join()
    assert "loading" == status.state
    assert status.loading_for_s is not None
    assert "loaded" == proxy.state


def test_device_is_resolved_at_build_time() -> None:
    """The configured device reaches the loader; status shows it after the build."""
    loader = FakeLoader()
    proxy = manager(loader, device="cpu")["enc"]
    proxy.load()
    assert ["cpu"] == loader.devices
    assert "cpu" == proxy.status().device


def test_proxies_satisfy_the_encoder_protocol() -> None:
    """Every kind's proxy is an lazyenc.Encoder."""
    mgr = EncoderManager(
        make_settings({"d": "dense", "r": "rerank", "s": "sparse", "n": "spacy"}),
        loaders={k: FakeLoader() for k in ("dense", "rerank", "sparse", "spacy")},
    )
    for name in mgr:
        assert isinstance(mgr[name], lazyenc.Encoder)


def test_a_pickled_proxy_arrives_unloaded() -> None:
    """Pickling carries the settings, not the model or the locks."""
    loader = FakeLoader()
    proxy = manager(loader)["enc"]
    proxy.load()
    clone = pickle.loads(pickle.dumps(proxy))
    assert ("enc", "idle", None) == (clone.name, clone.state, clone.peek())
