"""Test doubles for what real models cannot show: counting builds, injected
failures, slow builds. Pure Python: importing this module pulls in no ML library.

    loader = FakeLoader(kind="dense")
    mgr = EncoderManager(make_settings({"dense": "dense"}), loaders={"dense": loader})
    mgr["dense"].encode(["hi"]); assert loader.builds == 1
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ._config import EncoderSettings, HardwareSettings, Settings
from ._probe import Probe

__all__ = ["FakeDoc", "FakeLoader", "FakeModel", "make_settings"]


def _vector(text: str, dimension: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [digest[i % len(digest)] / 255.0 for i in range(dimension)]


class FakeDoc(list):  # type: ignore[type-arg]
    """A 'Doc': the text's whitespace tokens."""

    def __init__(self, text: str) -> None:
        super().__init__(text.split())
        self.text = text


class FakeModel:
    """Answers every kind's methods with deterministic values.

    ``fail`` makes every call raise it (an injected forward failure);
    ``gate`` makes every call wait for the event (a slow call); ``calls`` counts;
    ``entered`` is set when a call starts; ``seen`` and ``seen_kwargs`` record
    each call's inputs and keyword arguments.
    """

    def __init__(
        self,
        *,
        dimension: int = 8,
        fail: BaseException | None = None,
        gate: threading.Event | None = None,
    ) -> None:
        self.dimension = dimension
        self.fail = fail
        self.gate = gate
        self.calls = 0
        self.entered = threading.Event()
        self.seen: list[Any] = []
        self.seen_kwargs: list[dict[str, Any]] = []

    def _enter(self, inputs: Any = None, kwargs: dict[str, Any] | None = None) -> None:
        self.calls += 1
        self.seen.append(inputs)
        self.seen_kwargs.append(kwargs or {})
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if self.fail is not None:
            raise self.fail

    def encode(self, inputs: str | Iterable[str], **kwargs: Any) -> Any:
        """One vector per text (a list for a list, one vector for a string)."""
        self._enter(inputs, kwargs)
        if isinstance(inputs, str):
            return _vector(inputs, self.dimension)
        return [_vector(t, self.dimension) for t in inputs]

    encode_query = encode
    encode_document = encode

    def get_embedding_dimension(self) -> int:
        """The vector size, as SentenceTransformer reports it (identity pins read it)."""
        return self.dimension

    def decode(self, embedding: Any, top_k: int | None = None) -> list[tuple[str, float]]:
        """(dimension index as text, weight) for non-zero weights, heaviest first."""
        self._enter()
        pairs = sorted(((str(i), float(w)) for i, w in enumerate(embedding) if w), key=lambda p: -p[1])
        return pairs[:top_k] if top_k else pairs

    def predict(self, pairs: Iterable[tuple[str, str]], **kwargs: Any) -> list[float]:
        """A score per pair: the share of query words found in the document."""
        pairs = list(pairs)
        self._enter(pairs, kwargs)
        out = []
        for query, doc in pairs:
            words = set(query.lower().split())
            out.append(len(words & set(doc.lower().split())) / max(1, len(words)))
        return out

    def rank(
        self,
        query: str,
        documents: list[str],
        top_k: int | None = None,
        return_documents: bool = False,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """CrossEncoder.rank's shape, over predict's scores."""
        scores = self.predict([(query, d) for d in documents])
        ranked = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_k]
        return [
            {"corpus_id": i, "score": scores[i], **({"text": documents[i]} if return_documents else {})}
            for i in ranked
        ]

    def __call__(self, text: str, **kwargs: Any) -> FakeDoc:
        self._enter()
        return FakeDoc(text)

    def pipe(self, texts: Iterable[str], **kwargs: Any) -> Iterator[FakeDoc]:
        for text in texts:
            yield self(text)


class FakeLoader:
    """A loader that counts builds and can fail, block or dawdle.

    ``gate``: every build waits until the event is set; ``started`` is set when a
    build begins. ``fail``: builds raise it (set it to None to let later builds
    succeed). ``available=False`` makes the probe fail with ``reason``.
    """

    def __init__(
        self,
        *,
        dimension: int = 8,
        fail: BaseException | None = None,
        gate: threading.Event | None = None,
        build_delay_s: float = 0.0,
        available: bool = True,
        reason: str = "fake probe failed",
        weight_bytes: int = 1000,
        model_factory: Any = None,
    ) -> None:
        self.dimension = dimension
        self.fail = fail
        self.gate = gate
        self.build_delay_s = build_delay_s
        self.available = available
        self.reason = reason
        self.weight_bytes = weight_bytes
        self.model_factory = model_factory or (lambda: FakeModel(dimension=self.dimension))
        self.started = threading.Event()
        self.builds = 0
        self.devices: list[str] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FakeLoader(builds={self.builds})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Events and locks do not pickle; a copy in another process starts fresh.
        return (FakeLoader, (), {"dimension": self.dimension, "weight_bytes": self.weight_bytes})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def probe(self, settings: EncoderSettings, environ: Mapping[str, str]) -> Probe:
        if not self.available:
            return Probe(False, self.reason)
        return Probe(
            True,
            dimension=self.dimension,
            max_seq_length=128,
            revision="fake",
            weight_bytes=self.weight_bytes,
        )

    def build(self, settings: EncoderSettings, *, device: str, probe: Probe) -> Any:
        with self._lock:
            self.builds += 1
            self.devices.append(device)
        self.started.set()
        if self.gate is not None:
            self.gate.wait()
        if self.build_delay_s:
            time.sleep(self.build_delay_s)
        if self.fail is not None:
            raise self.fail
        return self.model_factory()


def make_settings(
    kinds: Mapping[str, str],
    *,
    lazy_encoders: bool = True,
    device: str = "cpu",
    **hardware: Any,
) -> Settings:
    """Settings with one encoder per ``{name: kind}``, model 'fake'."""
    return Settings(
        hardware=HardwareSettings(lazy_encoders=lazy_encoders, device=device, **hardware),
        encoders=tuple(EncoderSettings(name=n, kind=k, model="fake") for n, k in kinds.items()),
        source="<lazyenc.testing>",
    )
