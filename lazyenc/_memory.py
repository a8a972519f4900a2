"""Memory lifecycle: idle unload, the memory budget, fork safety, identity pins.

A manager owns one :class:`Lifecycle` shared by its proxies (a proxy built on
its own gets a private one). The lifecycle runs at most one reaper thread, which
waits on a condition until the earliest idle deadline of its proxies and exits
when none is pending, and it decides, before each build, whether the build fits
``max_loaded`` and ``memory_budget_mb``, evicting least-recently-used idle
encoders when it does not.

Lock order: a proxy's build lock, then the lifecycle's budget lock; other
proxies' build locks are only ever *tried* (non-blocking), so two builds that
want to evict each other can never deadlock. A proxy's counter lock and the
reaper's condition are leaves: nothing else is acquired while holding them.

Module import registers, once per process, an ``after_in_child`` fork hook that
returns every live proxy to ``idle`` with fresh locks, and an ``atexit`` hook
that stops every reaper thread.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from ._config import ExpectSettings, HardwareSettings
from ._exceptions import MemoryBudgetError
from ._log import log

if TYPE_CHECKING:
    from ._manager import EncoderManager
    from ._probe import Probe
    from ._proxy import EncoderProxy

__all__ = [
    "Lifecycle",
    "lifespan",
    "malloc_trim",
    "model_dimension",
    "pin_mismatch",
    "release_memory",
]


_LIVE_PROXIES: weakref.WeakSet[EncoderProxy] = weakref.WeakSet()
_LIVE_LIFECYCLES: weakref.WeakSet[Lifecycle] = weakref.WeakSet()
# Models held by proxies when the process forked, on a CUDA device: their
# destructors must not run in the child (the CUDA context is the parent's).
_FORK_ORPHANS: list[Any] = []


# -- giving memory back ---------------------------------------------------------
_libc: Any = None
_libc_tried = False


def _glibc() -> Any:
    """glibc through ctypes, or None (not Linux, musl, a libc without these functions)."""
    global _libc, _libc_tried
    if not _libc_tried:
        _libc_tried = True
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                _libc = ctypes.CDLL("libc.so.6")
                _libc.malloc_trim.argtypes = [ctypes.c_size_t]
                _libc.malloc_trim.restype = ctypes.c_int
                _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                _libc.mallopt.restype = ctypes.c_int
            except (OSError, AttributeError):
                _libc = None
    return _libc


def malloc_trim() -> bool:
    """Ask glibc to return free heap pages to the OS; False where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


_M_ARENA_MAX = -8  # from glibc's malloc.h


def limit_malloc_arenas(limit: int) -> bool:
    """``mallopt(M_ARENA_MAX, limit)``: threads created from now on share at most ``limit`` heaps.

    glibc gives each new thread its own heap ("arena"). A batch worker thread's
    heap keeps handing the activations' pages back to the kernel and faulting
    them in again on the next batch: here 2.4 to 7 times the page faults of the
    same forward pass in the main thread, and 6 to 8 % slower (docs/batching.md). With one
    arena the worker reuses the main heap's pages. It is process-wide and only
    affects threads that allocate for the first time afterwards, so it is an
    operator's choice (``[hardware] malloc_arena_max``), applied before the
    first build. False where there is no glibc.
    """
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, limit))


def release_memory(*, cuda: bool = False, trim: bool = True) -> None:
    """After the last reference to a model is gone: collect, empty the CUDA cache, trim the heap.

    ``del`` alone leaves reference cycles (modules point at their parents) and
    freed pages in glibc's arenas, so RSS hardly moves without these steps.
    """
    gc.collect()
    if cuda and "torch" in sys.modules:  # never import torch just to free memory
        torch = sys.modules["torch"]
        try:
            torch.cuda.empty_cache()
        except Exception:  # pragma: no cover - a broken CUDA runtime must not break unload
            log.debug("torch.cuda.empty_cache failed", exc_info=True)
    if trim:
        malloc_trim()


# -- identity pins ----------------------------------------------------------------
def model_dimension(model: Any) -> int | None:
    """The output dimension a built model reports, or None when it reports none."""
    for attr in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        method = getattr(model, attr, None)
        if callable(method):
            value = method()
            return int(value) if isinstance(value, int) else None
    return None


def pin_mismatch(expect: ExpectSettings, *, probe: Probe, model: Any = None) -> str:
    """'' when the pin holds, else a reason naming the expected and the actual values.

    Without ``model`` only the revision (known from the probe) is checked, so a
    wrong revision is refused before anything is built.
    """
    problems: list[str] = []
    if expect.revision is not None and expect.revision != probe.revision:
        problems.append(f"expected revision {expect.revision!r}, found {probe.revision!r}")
    if model is not None and expect.dimension is not None:
        actual = model_dimension(model)
        if actual != expect.dimension:
            shown = "none reported" if actual is None else str(actual)
            problems.append(f"expected dimension {expect.dimension}, the model has {shown}")
    return "identity pin failed: " + "; ".join(problems) if problems else ""


# -- the shared lifecycle ---------------------------------------------------------
class Lifecycle:
    """The idle reaper and the memory budget shared by one manager's proxies."""

    def __init__(self, hardware: HardwareSettings | None = None, *, name: str = "lazyenc") -> None:
        self.hardware = hardware or HardwareSettings()
        self.name = name
        self._proxies: weakref.WeakSet[EncoderProxy] = weakref.WeakSet()
        self._fresh_locks()
        self._closed = False
        self.malloc_arenas_limited = False
        _LIVE_LIFECYCLES.add(self)

    def _fresh_locks(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._budget_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._admitted: set[EncoderProxy] = set()

    def __repr__(self) -> str:
        return (
            f"<Lifecycle proxies={len(self._proxies)} max_loaded={self.hardware.max_loaded} "
            f"memory_budget_mb={self.hardware.memory_budget_mb}>"
        )

    def register(self, proxy: EncoderProxy) -> None:
        """Share this lifecycle with ``proxy``."""
        self._proxies.add(proxy)
        _LIVE_PROXIES.add(proxy)

    @property
    def budget_bytes(self) -> int | None:
        """memory_budget_mb in bytes (MiB, as the error messages print it), or None."""
        mb = self.hardware.memory_budget_mb
        return None if mb is None else int(mb * 2**20)

    def before_build(self) -> None:
        """Called before every build; the first applies ``malloc_arena_max``.

        Before the first build, so that the threads it starts (torch's thread
        pool, then the batch worker) share the heaps; not at init, which stays
        free of ctypes.
        """
        arenas = self.hardware.malloc_arena_max
        if arenas is not None and not self.malloc_arenas_limited:
            self.malloc_arenas_limited = limit_malloc_arenas(arenas)

    def snapshot(self) -> dict[str, Any]:
        """The budget and what the loaded encoders are estimated to hold; never waits."""
        loaded = [p for p in list(self._proxies) if p.loaded]
        return {
            "max_loaded": self.hardware.max_loaded,
            "memory_budget_bytes": self.budget_bytes,
            "loaded": sorted(p.name for p in loaded),
            "estimated_bytes": sum(p._estimated_bytes() for p in loaded),
            "reaper_running": self._thread is not None,
            "malloc_arena_max": self.hardware.malloc_arena_max if self.malloc_arenas_limited else None,
        }

    # -- idle reaper ---------------------------------------------------------------
    def wake(self) -> None:
        """A deadline changed: make the reaper look again (start it if needed)."""
        with self._cond:
            if self._closed:
                return
            if self._thread is None:
                if not any(p._idle_deadline is not None for p in list(self._proxies)):
                    return
                self._thread = threading.Thread(
                    target=self._reap, name=f"{self.name}-idle-reaper", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify_all()

    def _reap(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if self._closed or self._thread is not me:
                    return
                now = time.monotonic()
                due: list[EncoderProxy] = []
                earliest: float | None = None
                for proxy in list(self._proxies):
                    deadline = proxy._idle_deadline
                    if deadline is None:
                        continue
                    if deadline <= now:
                        due.append(proxy)
                    elif earliest is None or deadline < earliest:
                        earliest = deadline
                if not due:
                    if earliest is None:
                        self._thread = None  # nothing pending; wake() starts a new one
                        return
                    self._cond.wait(earliest - now)
                    continue
            # Unload outside the condition: it takes the proxy's own locks.
            for proxy in due:
                try:
                    proxy._idle_unload()
                except Exception:  # pragma: no cover - never let the reaper die
                    log.exception("idle unload of %s failed", proxy.name)
            del due

    # -- budget ---------------------------------------------------------------------
    def admit(self, proxy: EncoderProxy, need: int) -> None:
        """Make room for ``proxy``'s build (``need`` bytes) or raise MemoryBudgetError.

        Called by the proxy under its own build lock. Evicts least-recently-used
        loaded encoders with no call in flight; never one in use or loading.
        """
        max_loaded = self.hardware.max_loaded
        budget = self.budget_bytes
        if max_loaded is None and budget is None:
            return
        evicted: list[str] = []
        cuda = False
        try:
            with self._budget_lock:
                while True:
                    held = [
                        p for p in list(self._proxies) if p is not proxy and (p.loaded or p in self._admitted)
                    ]
                    used = sum(p._estimated_bytes() for p in held)
                    over_count = max_loaded is not None and len(held) + 1 > max_loaded
                    over_bytes = budget is not None and used + need > budget
                    if not over_count and not over_bytes:
                        self._admitted.add(proxy)
                        return
                    victims = sorted(
                        (p for p in held if p.loaded and not p._in_flight), key=lambda p: p._touched
                    )
                    # Evict nothing when even evicting every idle encoder would not make room.
                    rest = [p for p in held if p not in victims]
                    if (max_loaded is not None and len(rest) + 1 > max_loaded) or (
                        budget is not None and sum(p._estimated_bytes() for p in rest) + need > budget
                    ):
                        raise self._budget_error(proxy, need, rest)
                    for victim in victims:
                        was_cuda = victim._uses_cuda()
                        if victim._try_evict():
                            evicted.append(victim.name)
                            cuda = cuda or was_cuda
                            break
                    else:
                        raise self._budget_error(proxy, need, held)
        finally:
            if evicted:
                log.info("evicted %s to make room for %s", ", ".join(evicted), proxy.name)
                release_memory(cuda=cuda)

    def _budget_error(self, proxy: EncoderProxy, need: int, held: list[EncoderProxy]) -> MemoryBudgetError:
        parts = []
        if self.hardware.max_loaded is not None:
            parts.append(f"max_loaded = {self.hardware.max_loaded}")
        if self.hardware.memory_budget_mb is not None:
            parts.append(f"memory_budget_mb = {self.hardware.memory_budget_mb:g}")
        in_use = ", ".join(
            f"{p.name} ({p.state}, {p._in_flight} in flight, ~{p._estimated_bytes() / 2**20:.0f} MiB)"
            for p in held
        )
        detail = f"held by encoders in use: {in_use}" if held else "nothing else is in use"
        return MemoryBudgetError(proxy.name, needed_bytes=need, budget=" and ".join(parts), detail=detail)

    def build_done(self, proxy: EncoderProxy) -> None:
        """The admitted build ended (built or failed)."""
        with self._budget_lock:
            self._admitted.discard(proxy)

    # -- shutdown and fork -------------------------------------------------------------
    def close(self) -> None:
        """Stop the reaper (and each proxy's threads); idempotent."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        for proxy in list(self._proxies):
            proxy._stop_threads()

    @property
    def closed(self) -> bool:
        """Whether close() ran."""
        return self._closed

    def _after_fork_in_child(self) -> None:
        # The parent's reaper thread does not exist here; locks may have been held.
        self._fresh_locks()


def _after_fork_in_child() -> None:
    proxies = list(_LIVE_PROXIES)
    # GNU OpenMP's thread pool does not survive fork: a child of a parent that
    # ran torch hangs in its first parallel op unless torch stays on one thread
    # (what torch's own DataLoader workers do).
    ran_torch = any(p.kind != "spacy" and p._load_seconds is not None for p in proxies)
    if ran_torch and "torch" in sys.modules:
        try:
            sys.modules["torch"].set_num_threads(1)
        except Exception:  # pragma: no cover - a half-imported torch
            pass
    for lifecycle in list(_LIVE_LIFECYCLES):
        lifecycle._after_fork_in_child()
    for proxy in proxies:
        proxy._after_fork_in_child()


def _at_exit() -> None:
    for lifecycle in list(_LIVE_LIFECYCLES):
        try:
            lifecycle.close()
        except Exception:  # pragma: no cover - exit must go on
            log.debug("closing %r at exit failed", lifecycle, exc_info=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


def orphan_after_fork(model: Any) -> None:
    """Keep a model inherited across fork alive forever (its CUDA memory is the parent's)."""
    _FORK_ORPHANS.append(model)


# -- host integration --------------------------------------------------------------
def lifespan(
    manager: EncoderManager, *, warmup: bool = False, close_manager: bool = True
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A Starlette/FastAPI ``lifespan=`` that (optionally) warms up, then closes ``manager``.

    Public as ``lazyenc.admin.lifespan``. Warm-up and close run in a thread: both
    wait on builds and calls, which must not block the event loop.
    """

    @asynccontextmanager
    async def _lifespan(app: Any) -> AsyncIterator[None]:
        import asyncio

        if warmup:
            await asyncio.to_thread(manager.warmup)
        try:
            yield
        finally:
            if close_manager:
                await asyncio.to_thread(manager.close)

    return _lifespan
