"""Proxies: one per encoder, building the real model on first use, exactly once.

State machine::

    unavailable  (probe failed; reset() probes again)
    idle ──first call──> loading ──ok──> loaded ──unload()──> idle
                              └──error──> disabled ──reset()──> idle

    loaded ──idle_unload_s passed, or evicted for the budget──> idle
    disabled ──retry_after_s passed: the next call builds once──> loading

The memory lifecycle (idle timer, budget, fork hook) lives in ``_memory.py``;
the proxy only exposes small hooks to it (``_begin_call``/``_end_call`` ...).

Reading ``state``, ``status()``, ``peek()`` or ``repr()`` never builds and never
waits on the build lock, so a status page stays live during a long build.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from . import _batching
from ._config import EncoderSettings, HardwareSettings
from ._exceptions import (
    EncoderClosedError,
    EncoderLoadError,
    EncoderUnavailableError,
    MemoryBudgetError,
)
from ._loaders import Loader, resolve_device
from ._log import log
from ._memory import Lifecycle, orphan_after_fork, pin_mismatch, release_memory
from ._probe import Probe
from ._process import rss_bytes
from ._value import Value

__all__ = [
    "STATES",
    "ComponentStatus",
    "DenseProxy",
    "Encoder",
    "EncoderProxy",
    "RerankProxy",
    "SpacyProxy",
    "SparseProxy",
    "proxy_class",
]


State = Literal["unavailable", "idle", "loading", "loaded", "disabled"]
STATES: tuple[State, ...] = ("unavailable", "idle", "loading", "loaded", "disabled")


class ComponentStatus(Value):
    """A snapshot of one encoder, taken without loading anything."""

    name: str
    kind: str
    model: str
    state: State
    loaded: bool
    reason: str
    device: str
    dimension: int | None
    max_seq_length: int | None
    revision: str | None
    weight_bytes: int | None
    load_seconds: float | None
    loaded_at: float | None
    last_used_at: float | None
    calls: int
    errors: int
    loading_for_s: float | None = None
    rss_delta_bytes: int | None = None
    idle_unload_at: float | None = None
    in_flight: int = 0
    retry_at: float | None = None
    batches_run: int = 0
    mean_batch_size: float | None = None
    queue_depth: int = 0


@runtime_checkable
class Encoder(Protocol):
    """What every proxy offers besides its kind's own methods."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def loaded(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    def peek(self) -> Any: ...
    def load(self) -> Any: ...
    def unload(self) -> bool: ...
    def status(self) -> ComponentStatus: ...


class EncoderProxy:
    """Stands in for one model; subclasses add the methods of their kind."""

    kind: ClassVar[str] = ""

    def __init__(
        self,
        settings: EncoderSettings,
        *,
        loader: Loader,
        hardware: HardwareSettings | None = None,
        environ: Mapping[str, str] | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.settings = settings
        self._loader = loader
        self._hardware = hardware or HardwareSettings()
        self._environ = os.environ if environ is None else environ
        self._build_lock = threading.Lock()
        # One model never runs two calls at once (tokenizers are not re-entrant); the batch worker too.
        self._call_lock = threading.Lock()
        self._model: Any = None
        self._failure: BaseException | None = None
        self._closed = False
        self._device: str | None = None
        self._load_seconds: float | None = None
        self._loaded_at: float | None = None
        self._loading_since: float | None = None
        self._last_used_at: float | None = None
        self._rss_delta: int | None = None
        self._calls = 0
        self._errors = 0
        self._probe = Probe(False, "not probed")
        self._state: State = "unavailable"
        self._reason = ""
        # Memory lifecycle (lazyenc._memory): in-flight calls, idle deadline, LRU stamp.
        self._counter_lock = threading.Lock()
        self._in_flight = 0
        self._idle_deadline: float | None = None
        self._touched = 0.0
        self._failed_mono: float | None = None
        self._owns_lifecycle = lifecycle is None
        self._lifecycle = lifecycle or Lifecycle(self._hardware, name=f"lazyenc-{settings.name}")
        self._lifecycle.register(self)
        self._apply_probe(loader.probe(settings, self._environ))
        self._batcher = _batching.make_batcher(self)

    # -- non-forcing views -------------------------------------------------
    @property
    def name(self) -> str:
        """The encoder's name in the TOML."""
        return self.settings.name

    @property
    def state(self) -> State:
        """One of unavailable, idle, loading, loaded, disabled."""
        return self._state

    @property
    def loaded(self) -> bool:
        """Whether a built model is held right now."""
        return self._model is not None

    @property
    def reason(self) -> str:
        """Why the encoder is unavailable or disabled, or why its last build was refused; else ''."""
        return self._reason

    @property
    def probe(self) -> Probe:
        """What the init-time probe found on disk."""
        return self._probe

    def peek(self) -> Any:
        """The built model, or None; never builds."""
        return self._model

    def status(self) -> ComponentStatus:
        """A snapshot of this encoder; never builds or waits."""
        probe = self._probe
        since = self._loading_since
        return ComponentStatus(
            name=self.name,
            kind=self.kind,
            model=self.settings.model,
            state=self._state,
            loaded=self._model is not None,
            reason=self._reason,
            device=self._device or self.settings.device or self._hardware.device,
            dimension=probe.dimension,
            max_seq_length=probe.max_seq_length,
            revision=probe.revision,
            weight_bytes=probe.weight_bytes,
            load_seconds=self._load_seconds,
            loaded_at=self._loaded_at,
            last_used_at=self._last_used_at,
            calls=self._calls,
            errors=self._errors,
            loading_for_s=None if since is None else round(time.monotonic() - since, 3),
            rss_delta_bytes=self._rss_delta,
            idle_unload_at=_wall(self._idle_deadline),
            in_flight=self._in_flight,
            retry_at=_wall(self._retry_deadline()),
            **_batching.status_fields(self._batcher),
        )

    def __repr__(self) -> str:
        extra = f" reason={self._reason!r}" if self._reason else ""
        return f"<{type(self).__name__} {self.name!r} state={self._state}{extra}>"

    # Proxies hold locks and maybe a model: a pickled proxy arrives unloaded.
    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.settings, self._loader, self._hardware))

    # -- lifecycle -----------------------------------------------------------
    def load(self) -> Any:
        """Build the model now if it is not built; return it."""
        model = self._model
        return model if model is not None else self._build()

    def unload(self) -> bool:
        """Drop the model and give its memory back; True if one was loaded.

        Waits for an in-flight call. Queued batched requests run first, then the
        batch worker stops; calls arriving meanwhile wait and then build the
        model again.
        """
        with _batching.paused(self._batcher), self._build_lock, self._call_lock, self._counter_lock:
            if self._model is None:
                return False
            cuda = self._drop_model()
        release_memory(cuda=cuda)
        log.info("unloaded %s", self.name)
        return True

    def reset(self) -> None:
        """Forget a failed build (and probe again), so the next call builds anew."""
        self.unload()
        with self._build_lock:
            self._failure = None
            self._reason = ""
            self._apply_probe(self._loader.probe(self.settings, self._environ))

    def close(self) -> None:
        """Unload and refuse later calls."""
        self._closed = True
        self.unload()
        if self._owns_lifecycle:
            self._lifecycle.close()
        else:
            self._stop_threads()

    def _apply_probe(self, probe: Probe) -> None:
        self._probe = probe
        self._state = "idle" if probe.available else "unavailable"
        self._reason = "" if probe.available else probe.reason

    def _check_usable(self) -> None:
        if self._closed:
            raise EncoderClosedError(self.name)
        if self._state == "unavailable":
            raise EncoderUnavailableError(self.name, self._reason)
        if self._state == "disabled":
            deadline = self._retry_deadline()
            # retry_after_s: once due, the caller that wins the build lock builds again.
            if deadline is None or time.monotonic() < deadline:
                raise EncoderLoadError(self.name, self._reason) from self._failure

    def _build(self) -> Any:
        self._check_usable()
        with self._build_lock:
            # Double-checked: another thread may have built (or failed) while we waited.
            if self._model is not None:
                return self._model
            self._check_usable()
            if self._state == "disabled":
                log.info("retrying the build of %s after retry_after_s", self.name)
            pinned = pin_mismatch(self.settings.expect, probe=self._probe)
            if pinned:
                raise self._disable(pinned, None)
            previous = self._state
            self._state = "loading"
            self._loading_since = time.monotonic()
            self._lifecycle.before_build()
            try:
                self._lifecycle.admit(self, self._estimated_bytes())
            except BaseException as exc:
                self._state = previous  # over budget: not a failure of the encoder
                self._loading_since = None
                if previous == "idle" and isinstance(exc, MemoryBudgetError):
                    # Shown by status() and the panel, where a background load has no caller.
                    self._reason = f"last build refused: {exc}"
                raise
            try:
                model = self._build_admitted()
            finally:
                self._lifecycle.build_done(self)
            if self._in_flight == 0:
                self._schedule_idle()
            return model

    def _build_admitted(self) -> Any:
        # Under the build lock, with room made by the lifecycle.
        rss_before = rss_bytes()
        started = time.perf_counter()
        try:
            device = resolve_device(self.settings.device or self._hardware.device, kind=self.kind)
            model = self._loader.build(self.settings, device=device, probe=self._probe)
        except Exception as exc:
            raise self._disable(f"{type(exc).__name__}: {exc}", exc) from exc
        pinned = pin_mismatch(self.settings.expect, probe=self._probe, model=model)
        if pinned:
            del model
            release_memory(cuda=device.startswith("cuda"))
            raise self._disable(pinned, None)
        self._load_seconds = round(time.perf_counter() - started, 4)
        rss_after = rss_bytes()
        if rss_before is not None and rss_after is not None:
            self._rss_delta = rss_after - rss_before
        self._device = device
        self._loaded_at = time.time()
        self._touched = time.monotonic()
        self._model = model
        self._state = "loaded"
        self._reason = ""
        self._loading_since = None
        log.info("built %s (%s) on %s in %.2f s", self.name, self.kind, device, self._load_seconds)
        return model

    def _disable(self, reason: str, exc: BaseException | None) -> EncoderLoadError:
        """Mark a failed build; returns the error to raise."""
        self._failure = exc
        self._reason = reason
        self._state = "disabled"
        self._failed_mono = time.monotonic()
        self._loading_since = None
        log.warning("building %s failed: %s", self.name, reason)
        return EncoderLoadError(self.name, reason)

    # -- memory lifecycle hooks (lazyenc._memory) -------------------------------------
    def _begin_call(self) -> None:
        """A call (direct or batched) starts: the idle timer stops until the last one ends."""
        with self._counter_lock:
            self._in_flight += 1
            self._idle_deadline = None

    def _end_call(self) -> None:
        """A call ends: the last one out starts the idle timer."""
        with self._counter_lock:
            self._in_flight -= 1
            self._touched = time.monotonic()
            if self._in_flight:
                return
        self._schedule_idle()

    def _idle_unload_s(self) -> float:
        value = self.settings.idle_unload_s
        return self._hardware.idle_unload_s if value is None else value

    def _schedule_idle(self) -> None:
        idle_s = self._idle_unload_s()
        if not idle_s or self._closed:
            return
        with self._counter_lock:
            if self._in_flight or self._model is None:
                return
            self._idle_deadline = time.monotonic() + idle_s
        self._lifecycle.wake()

    def _idle_unload(self) -> None:
        """Called by the reaper once the deadline passed; a call or a build in progress wins."""
        if not self._build_lock.acquire(blocking=False):
            # Only unload/reset/eviction hold the lock of a loaded model, and they drop it.
            self._idle_deadline = None
            return
        try:
            with self._counter_lock:
                deadline = self._idle_deadline
                if deadline is None or deadline > time.monotonic():
                    return
                self._idle_deadline = None
                if self._in_flight or self._model is None:
                    return
                cuda = self._drop_model()
        finally:
            self._build_lock.release()
        release_memory(cuda=cuda)
        log.info("unloaded %s after %g s idle", self.name, self._idle_unload_s())

    def _try_evict(self) -> bool:
        """Unload for the budget if nothing uses the model; never waits. Caller releases memory."""
        if not self._build_lock.acquire(blocking=False):
            return False
        try:
            with self._counter_lock:
                if self._in_flight or self._model is None:
                    return False
                self._drop_model()
        finally:
            self._build_lock.release()
        return True

    def _drop_model(self) -> bool:
        """Forget the model (caller holds the counter lock); True when it was on CUDA."""
        cuda = self._uses_cuda()
        self._model = None
        self._state = "idle"
        self._device = None
        self._idle_deadline = None
        if self._batcher is not None:
            # Its replicas share the model's weights: dropped now, so release_memory() returns them.
            self._batcher.drop_replicas()
            self._batcher.retire()  # its worker holds no model; it ends once its queue is empty
        return cuda

    def _uses_cuda(self) -> bool:
        return (self._device or "").startswith("cuda")

    def _estimated_bytes(self) -> int:
        """What a build of this encoder costs: the RSS its last build took, else its weights on disk."""
        if self._rss_delta is not None and self._rss_delta > 0:
            return self._rss_delta
        return self._probe.weight_bytes or 0

    def _retry_deadline(self) -> float | None:
        after = self.settings.retry_after_s
        if self._state != "disabled" or after is None or self._failed_mono is None:
            return None
        return self._failed_mono + after

    def _stop_threads(self) -> None:
        """Stop this encoder's own threads: the batch worker (idempotent)."""
        if self._batcher is not None:
            self._batcher.stop()

    def _after_fork_in_child(self) -> None:
        """In a forked child: no model from the parent, fresh locks, no threads.

        unavailable and disabled stay as they are: the child's probe and build
        would find the same files and the same failure (retry_after_s and
        reset() still apply).
        """
        model = self._model
        if model is not None and self._uses_cuda():
            orphan_after_fork(model)  # its destructor would touch the parent's CUDA context
        del model
        self._build_lock = threading.Lock()
        self._call_lock = threading.Lock()
        self._counter_lock = threading.Lock()
        if self._batcher is not None:
            self._batcher._forget_after_fork()
        self._model = None
        self._device = None
        self._in_flight = 0
        self._idle_deadline = None
        self._loading_since = None
        if self._state in ("loading", "loaded"):
            self._state = "idle"

    # -- calls ----------------------------------------------------------------
    def _call(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run a method of the model (a name, or a function taking the model first), serialised.

        Counts as one call in flight; the model's own errors pass unchanged.
        """
        self._begin_call()
        try:
            return self._invoke(method, *args, **kwargs)
        finally:
            self._end_call()

    def _invoke(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``_call`` without the in-flight count, for callers that already hold one (batches)."""
        model = self._model
        if model is None:
            model = self._build()
        fn = getattr(model, method) if isinstance(method, str) else partial(method, model)
        with self._call_lock:
            self._calls += 1
            try:
                return fn(*args, **kwargs)
            except BaseException:
                self._errors += 1
                raise
            finally:
                self._last_used_at = time.time()


def _wall(deadline: float | None) -> float | None:
    """A time.monotonic() deadline as epoch seconds."""
    return None if deadline is None else round(time.time() + (deadline - time.monotonic()), 3)


def _rebuild(
    cls: type[EncoderProxy], settings: EncoderSettings, loader: Loader, hardware: HardwareSettings
) -> EncoderProxy:
    return cls(settings, loader=loader, hardware=hardware)


class DenseProxy(EncoderProxy):
    """A SentenceTransformer: same arguments and return types."""

    kind = "dense"

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        """SentenceTransformer.encode."""
        return _batching.call(self, "encode", args, kwargs)

    def encode_query(self, *args: Any, **kwargs: Any) -> Any:
        """SentenceTransformer.encode_query."""
        return _batching.call(self, "encode_query", args, kwargs)

    def encode_document(self, *args: Any, **kwargs: Any) -> Any:
        """SentenceTransformer.encode_document."""
        return _batching.call(self, "encode_document", args, kwargs)

    async def aencode(self, *args: Any, **kwargs: Any) -> Any:
        """encode, awaitable; shares batches with thread callers."""
        return await _batching.acall(self, "encode", args, kwargs)

    async def aencode_query(self, *args: Any, **kwargs: Any) -> Any:
        """encode_query, awaitable."""
        return await _batching.acall(self, "encode_query", args, kwargs)

    async def aencode_document(self, *args: Any, **kwargs: Any) -> Any:
        """encode_document, awaitable."""
        return await _batching.acall(self, "encode_document", args, kwargs)


class SparseProxy(DenseProxy):
    """A SparseEncoder (SPLADE): encode like a dense model, plus decode."""

    kind = "sparse"

    def decode(self, embedding: Any, top_k: int | None = None) -> Any:
        """SparseEncoder.decode: (token, weight) pairs."""
        return self._call("decode", embedding, top_k=top_k)

    async def adecode(self, embedding: Any, top_k: int | None = None) -> Any:
        """decode, awaitable (in a thread)."""
        return await _batching.in_thread(self.decode, embedding, top_k=top_k)


class RerankProxy(EncoderProxy):
    """A CrossEncoder."""

    kind = "rerank"

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """CrossEncoder.predict: one score per (query, document) pair."""
        return _batching.call(self, "predict", args, kwargs)

    async def apredict(self, *args: Any, **kwargs: Any) -> Any:
        """predict, awaitable; shares batches with thread callers."""
        return await _batching.acall(self, "predict", args, kwargs)

    def rank(
        self,
        query: str,
        documents: list[str],
        *,
        top_k: int | None = None,
        return_documents: bool = False,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """CrossEncoder.rank: ``[{"corpus_id", "score"[, "text"]}]``, best first."""
        result: list[dict[str, Any]] = _batching.call(
            self, "rank", (query, documents), dict(kwargs, top_k=top_k, return_documents=return_documents)
        )
        return result

    async def arank(
        self,
        query: str,
        documents: list[str],
        *,
        top_k: int | None = None,
        return_documents: bool = False,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """rank, awaitable; its pairs share batches with predict calls."""
        result: list[dict[str, Any]] = await _batching.acall(
            self, "rank", (query, documents), dict(kwargs, top_k=top_k, return_documents=return_documents)
        )
        return result


class SpacyProxy(EncoderProxy):
    """A spaCy Language pipeline."""

    kind = "spacy"

    def __call__(self, text: str, **kwargs: Any) -> Any:
        """Run the pipeline on one text; returns a Doc."""
        return self._call("__call__", text, **kwargs)

    def pipe(self, texts: Any, **kwargs: Any) -> list[Any]:
        """Language.pipe, materialised into a list so the model is released when it returns."""
        result: list[Any] = self._call(_pipe_list, texts, **kwargs)
        return result

    async def acall(self, text: str, **kwargs: Any) -> Any:
        """Run the pipeline on one text in a thread; returns a Doc. spaCy is not batched."""
        return await _batching.in_thread(self, text, **kwargs)

    async def apipe(self, texts: Any, **kwargs: Any) -> list[Any]:
        """pipe, awaitable (in a thread)."""
        result: list[Any] = await _batching.in_thread(self.pipe, texts, **kwargs)
        return result


def _pipe_list(nlp: Any, texts: Any, **kwargs: Any) -> list[Any]:
    # Consumed inside the call so the generator never runs outside the model's lock.
    return list(nlp.pipe(texts, **kwargs))


_PROXIES: dict[str, type[EncoderProxy]] = {
    cls.kind: cls for cls in (DenseProxy, RerankProxy, SparseProxy, SpacyProxy)
}


def proxy_class(kind: str) -> type[EncoderProxy]:
    """The proxy class for a kind."""
    if kind == "remote" and kind not in _PROXIES:  # imported late: _remote builds on this module
        from ._remote import RemoteProxy

        _PROXIES[kind] = RemoteProxy
    return _PROXIES[kind]
