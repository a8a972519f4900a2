"""Unload gives memory back (issue 5): no reference to a packaged model outlives unload()."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lazyenc import EncoderManager

pytestmark = pytest.mark.real

CONFIG = Path(__file__).resolve().parent.parent / "config.example.toml"
TEXTS = [f"sentence number {i} about lazy loading of encoders" for i in range(12)]

CALLS: dict[str, Callable[..., Any]] = {
    "dense": lambda proxy, texts, **kw: proxy.encode(texts, **kw),
    "sparse": lambda proxy, texts, **kw: proxy.encode(texts, **kw),
    "rerank": lambda proxy, texts, **kw: proxy.predict([("what is lazy loading?", t) for t in texts], **kw),
    "spacy": lambda proxy, texts, **kw: proxy.pipe(texts, **kw),
}


def call_concurrently(kind: str, proxy: Any) -> None:
    """Six threads at once, so dense, sparse and rerank go through the batch worker."""
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            CALLS[kind](proxy, TEXTS[:n])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [] == errors


@pytest.mark.parametrize("kind", ["dense", "rerank", "sparse", "spacy"])
def test_no_reference_to_the_model_survives_unload_after_concurrent_calls(kind: str) -> None:
    """After batched concurrent calls, unload() leaves the model unreachable (collected, not just dropped)."""
    with EncoderManager.from_toml(CONFIG) as mgr:
        proxy = mgr[kind]
        model = weakref.ref(proxy.load())
        call_concurrently(kind, proxy)
        assert proxy.unload()
        assert (None, "idle", None) == (model(), proxy.state, proxy.peek())


@pytest.mark.parametrize("kind", ["dense", "spacy"])
def test_a_failing_call_reaches_the_caller_and_unload_still_frees_the_model(kind: str) -> None:
    """The model's own exception reaches the caller unchanged; once the caller lets it go, nothing holds the model."""
    with EncoderManager.from_toml(CONFIG) as mgr:
        proxy = mgr[kind]
        model = weakref.ref(proxy.load())
        raised: type[BaseException] | None = None
        try:
            CALLS[kind](proxy, TEXTS, unknown_keyword=1)
        except (TypeError, ValueError) as exc:
            raised = type(exc)
            assert "unknown_keyword" in str(exc)
        assert raised is not None
        assert proxy.unload()
        assert None is model()
