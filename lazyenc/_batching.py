"""Micro-batching: concurrent calls to one encoder share one model call.

Each dense, sparse or rerank proxy with ``batch`` enabled owns a :class:`Batcher`.
A caller turns its call into a *plan* (validated inputs plus a batch key made
of the method and every output-changing keyword), puts a request carrying a
``concurrent.futures.Future`` on the queue and waits on the future: a thread
with ``future.result()``, a coroutine with ``asyncio.wrap_future``. So threads
and tasks share batches.

One worker thread per loaded encoder takes the oldest request, waits up to
``max_wait_ms`` (on a condition, never a sleep loop) for more requests with the
same key, up to ``max_size`` texts, sorts the texts by length, runs one model
call through the proxy's ``_call`` (so batched and unbatched calls never run
at once) and hands each caller its own rows, in its own order, with the type
the model would have returned for that call alone.

Calls that cannot be batched faithfully (positional options, multi-process
pools, a ``device``, quantised ``precision``, unhashable options, non-text
inputs, empty lists) take the plain serialised path, unchanged.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ._config import BatchSettings
from ._exceptions import InvalidInputError, OverloadedError
from ._lanes import auto_parallel, limit_this_thread, replicate, torch_threads
from ._log import log

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from ._proxy import EncoderProxy

__all__ = [
    "BATCHED_KINDS",
    "CHUNK_OVERHEAD_CHARS",
    "MIN_SPLIT_TEXTS",
    "MODEL_BATCH_SIZE",
    "Batcher",
    "Plan",
    "acall",
    "call",
    "chunk_size",
    "in_thread",
    "make_batcher",
    "paused",
    "plan_call",
    "split",
    "status_fields",
]


# Seconds a worker waits for work before it ends (the next request starts a new one).
WORKER_IDLE_EXIT_S = 30.0
BATCHED_KINDS = frozenset({"dense", "sparse", "rerank"})
# The batch_size a coalesced call passes to the model when batch.model_batch_size is not set: the
# model sorts the texts by length and runs chunks of that size. SPLADE's [chunk, tokens, vocab]
# activations make small chunks fastest, so sparse has a fixed size; dense and rerank pick one
# per call (chunk_size), up to this many texts a chunk.
MODEL_BATCH_SIZE = {"dense": 64, "rerank": 64, "sparse": 8}
# What one more forward pass costs, in padded characters (texts x the chunk's longest): one more
# chunk pays off when it saves more padding than this. MiniLM on this 2-core CPU: about 10 ms a
# pass against 0.22 ms a token, some 45 tokens of 5 to 6 characters (docs/batching.md).
CHUNK_OVERHEAD_CHARS = {"dense": 250, "rerank": 250}
# The same, for a part that runs on a lane of one torch thread (lazyenc._lanes), where a padded
# character costs twice as much: MiniLM here, fitted over 1 to 16 texts of 4 to 20 words, takes
# 9.2 ms a pass, 0.58 ms a text and 0.052 ms a padded character (docs/batching.md).
LANE_PASS_CHARS = {"dense": 180, "rerank": 180}
LANE_TEXT_CHARS = {"dense": 11, "rerank": 11}
# A coalesced call of fewer texts runs whole: parts of 4 texts or so gain nothing from a core
# each, while each part pays a whole forward pass (docs/batching.md#parallel-lanes).
MIN_SPLIT_TEXTS = 12

# Options that change nothing in the output; the worker picks its own batch size.
_IGNORED = frozenset({"batch_size", "show_progress_bar"})
# Options that may be given as None (the default) and are then dropped.
_NONE_DEFAULTS = frozenset({"device", "pool", "chunk_size"})
# Per method, the options batched calls may carry; any other option goes unbatched.
_PROMPTS = frozenset({"prompt_name", "prompt", "processing_kwargs"})
_DENSE = _PROMPTS | {"task", "output_value", "precision", "convert_to_numpy", "convert_to_tensor"}
_DENSE |= {"normalize_embeddings", "truncate_dim"}
_SPARSE = _PROMPTS | {
    "task",
    "convert_to_tensor",
    "convert_to_sparse_tensor",
    "save_to_cpu",
    "max_active_dims",
}
_PREDICT = _PROMPTS | {"activation_fn", "apply_softmax", "convert_to_numpy", "convert_to_tensor"}
_RANK = frozenset({"prompt_name", "prompt", "activation_fn"})
_ALLOWED: dict[tuple[str, str], frozenset[str]] = {
    **{("dense", m): _DENSE for m in ("encode", "encode_query", "encode_document")},
    **{("sparse", m): _SPARSE for m in ("encode", "encode_query", "encode_document")},
    ("rerank", "predict"): _PREDICT,
    ("rerank", "rank"): _RANK,
}
# Not text at all: a clear error rather than a tokenizer's.
_NOT_TEXT = (type(None), bool, int, float, complex, bytes, bytearray)


class _Unbatchable(Exception):
    """Internal: this call takes the plain serialised path."""


# Plain slotted classes, not dataclasses: these are internal records, and each
# dataclass costs about a millisecond of `import lazyenc` (issue 2's init budget).
class Plan:
    """One validated call: what to run, which batch it may join, how to finish it."""

    __slots__ = ("method", "key", "items", "singular", "kwargs", "finish")

    def __init__(
        self,
        method: str,
        key: Hashable,
        items: list[Any],
        singular: bool,
        kwargs: Mapping[str, Any],
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        self.method = method
        self.key = key
        self.items = items
        self.singular = singular
        self.kwargs = kwargs
        self.finish = finish

    def result(self, rows: Any) -> Any:
        return rows if self.finish is None else self.finish(rows)


class _Request:
    __slots__ = ("plan", "future", "enqueued")

    def __init__(self, plan: Plan, future: Future[Any], enqueued: float) -> None:
        self.plan = plan
        self.future = future
        self.enqueued = enqueued


# -- planning: validate inputs and build the batch key, in the caller's thread ------
def plan_call(proxy: EncoderProxy, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan | None:
    """A Plan for this call, None when it must go unbatched; InvalidInputError for bad input."""
    allowed = _ALLOWED.get((proxy.kind, method))
    if allowed is None:
        return None
    try:
        if method == "rank":
            return _plan_rank(proxy.name, args, kwargs)
        args, kwargs = _take_first(args, kwargs, "inputs")
        if len(args) != 1:
            raise _Unbatchable
        options, key = _options(kwargs, allowed)
        items: list[Any]
        if method == "predict":
            items, singular = _pairs(proxy.name, args[0], "inputs")
        else:
            if options.get("precision", "float32") != "float32":
                raise _Unbatchable  # int8/uint8 ranges depend on the whole call's rows
            items, singular = _texts(proxy.name, args[0], "inputs")
    except _Unbatchable:
        return None
    return Plan(method, (method, key), items, singular, options)


def _take_first(
    args: tuple[Any, ...], kwargs: dict[str, Any], name: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not args and name in kwargs:
        kwargs = dict(kwargs)
        args = (kwargs.pop(name),)
    return args, kwargs


def _options(kwargs: Mapping[str, Any], allowed: frozenset[str]) -> tuple[dict[str, Any], Hashable]:
    options: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in _IGNORED:
            # An invalid batch_size must still fail the way the model fails it.
            if name == "batch_size" and not (isinstance(value, int) and value > 0):
                raise _Unbatchable
            continue
        if name in _NONE_DEFAULTS and value is None:
            continue
        if name not in allowed:
            raise _Unbatchable
        options[name] = value
    try:
        key = tuple(sorted((name, _freeze(value)) for name, value in options.items()))
        hash(key)
    except TypeError:
        raise _Unbatchable from None
    return options, key


def _freeze(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return ("dict", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    hash(value)
    # The type keeps True, 1 and 1.0 apart: the model may treat them differently.
    return (type(value).__name__, value)


def _texts(name: str, inputs: Any, argument: str) -> tuple[list[str], bool]:
    if isinstance(inputs, str):
        return [inputs], True
    if isinstance(inputs, _NOT_TEXT):
        raise InvalidInputError(
            name, argument, f"must be a str or a list of str, got {type(inputs).__name__} {inputs!r:.60}"
        )
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise _Unbatchable  # arrays, generators, images, dicts, []: the model decides
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            if isinstance(text, _NOT_TEXT):
                raise InvalidInputError(
                    name, f"{argument}[{i}]", f"must be a str, got {type(text).__name__} {text!r:.60}"
                )
            raise _Unbatchable  # multimodal inputs
    return list(inputs), False


def _pairs(name: str, inputs: Any, argument: str) -> tuple[list[tuple[str, str]], bool]:
    if isinstance(inputs, (list, tuple)) and inputs and not isinstance(inputs[0], (list, tuple)):
        return [_pair(name, inputs, argument)], True  # one pair, as CrossEncoder.predict reads it
    if not isinstance(inputs, (list, tuple)):
        if isinstance(inputs, (str, *_NOT_TEXT)):
            raise InvalidInputError(
                name,
                argument,
                f"must be a (query, document) pair or a list of pairs, got {type(inputs).__name__}",
            )
        raise _Unbatchable
    if not inputs:
        raise _Unbatchable
    return [_pair(name, pair, f"{argument}[{i}]") for i, pair in enumerate(inputs)], False


def _pair(name: str, pair: Any, argument: str) -> tuple[str, str]:
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise InvalidInputError(name, argument, f"must be a (query, document) pair, got {pair!r:.60}")
    for text in pair:
        if not isinstance(text, str):
            if isinstance(text, _NOT_TEXT):
                raise InvalidInputError(
                    name, argument, f"must hold two str, got {type(text).__name__} {text!r:.60}"
                )
            raise _Unbatchable
    return (pair[0], pair[1])


def _plan_rank(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan:
    kwargs = dict(kwargs)
    if len(args) > 2:
        raise _Unbatchable
    query = args[0] if args else kwargs.pop("query", None)
    documents = args[1] if len(args) > 1 else kwargs.pop("documents", None)
    top_k = kwargs.pop("top_k", None)
    return_documents = kwargs.pop("return_documents", False)
    if not isinstance(query, str):
        if isinstance(query, _NOT_TEXT):
            raise InvalidInputError(name, "query", f"must be a str, got {type(query).__name__}")
        raise _Unbatchable
    if top_k is not None and not isinstance(top_k, int):
        raise _Unbatchable
    docs, _ = _texts(name, documents, "documents")
    options, key = _options(kwargs, _RANK)
    pairs = [(query, doc) for doc in docs]

    def finish(rows: Any) -> list[dict[str, Any]]:
        # CrossEncoder.rank's own result: floats, best first (stable), top_k kept.
        if getattr(rows, "ndim", 1) != 1:
            raise ValueError(
                "CrossEncoder.rank() only works for models with num_labels=1. "
                "Consider using CrossEncoder.predict() with input pairs instead."
            )
        scores = rows.tolist() if hasattr(rows, "tolist") else [float(s) for s in rows]
        results: list[dict[str, Any]] = []
        for i, score in enumerate(scores):
            results.append({"corpus_id": i, "score": score})
            if return_documents:
                results[-1]["text"] = docs[i]
        return sorted(results, key=lambda r: r["score"], reverse=True)[:top_k]

    # Shares batches with plain predict calls of the same options.
    return Plan("predict", ("predict", key), pairs, False, options, finish)


# -- splitting a batched result ---------------------------------------------------------
def _take(out: Any, rows: list[int], singular: bool) -> Any:
    """The given rows of a batched result, shaped as the model returns them for one call."""
    if singular:
        return out[rows[0]]
    if isinstance(out, list):
        return [out[i] for i in rows]
    module = type(out).__module__
    if module == "numpy":
        import numpy as np

        return out[np.asarray(rows, dtype=np.intp)]
    if module == "torch":
        import torch

        # index_select keeps the layout: a sparse COO batch gives a sparse COO slice.
        return out.index_select(0, torch.as_tensor(rows, dtype=torch.long, device=out.device))
    raise TypeError(f"cannot split a batched result of type {type(out).__name__}")


def _length(item: Any) -> int:
    # Characters, as sentence-transformers sorts (a fair proxy for tokens).
    if isinstance(item, str):
        return len(item)
    return sum(len(part) for part in item)


def chunk_size(lengths: list[int], *, overhead: float, largest: int) -> int:
    """The batch_size for one model call on texts of these lengths, sorted longest first.

    The model runs uniform chunks of the sorted texts, each padded to its
    longest; of the chunk sizes up to ``largest``, this picks the one whose
    padded characters plus ``overhead`` per chunk are fewest. Mixed lengths
    split into more chunks, similar lengths run in fewer.
    """
    n = len(lengths)
    best, best_cost, tried = min(n, largest), float("inf"), 0
    for chunks in range(max(1, -(-n // largest)), n + 1):
        size = -(-n // chunks)
        if size == tried:
            continue
        tried = size
        cost = sum(overhead + min(size, n - start) * lengths[start] for start in range(0, n, size))
        if cost < best_cost:
            best, best_cost = size, cost
    return max(1, best)


def _part_cost(lengths: list[int], overhead: float, per_text: float, largest: int) -> tuple[float, int]:
    """Cost and batch_size of one call on texts sorted longest first, in 1 to 4 uniform chunks."""
    n = len(lengths)
    best: tuple[float, int] = (float("inf"), max(1, min(n, largest)))
    for chunks in range(max(1, -(-n // largest)), 5):
        size = -(-n // chunks)
        cost = sum(overhead + min(size, n - start) * lengths[start] for start in range(0, n, size))
        best = min(best, (cost + per_text * n, size))
    return best


def split(
    lengths: list[list[int]], *, parts: int, overhead: float, per_text: float, largest: int
) -> tuple[list[int], list[int]]:
    """Where to cut requests into ``parts`` calls that take about as long, and their batch sizes.

    ``lengths`` holds each request's text lengths, the requests sorted by their
    longest text, longest first. A call costs ``overhead`` per chunk (one
    forward pass), ``per_text`` per text, and its padded characters; of two
    parts, the cut with the cheapest slower part is taken. Returns the index
    of the first request of every part after the first, and each part's
    batch_size.
    """

    def cost(group: list[list[int]]) -> tuple[float, int]:
        flat = sorted((n for texts in group for n in texts), reverse=True)
        return _part_cost(flat, overhead, per_text, largest)

    if parts == 2:
        options = []
        for cut in range(1, len(lengths)):
            (head, head_size), (tail, tail_size) = cost(lengths[:cut]), cost(lengths[cut:])
            options.append((max(head, tail), cut, head_size, tail_size))
        _, cut, head_size, tail_size = min(options)
        return [cut], [head_size, tail_size]
    # More parts: equal shares of the summed cost, each part then chunked on its own.
    weights = [sum(texts) + per_text * len(texts) for texts in lengths]
    prefix = list(itertools.accumulate(weights))
    cuts: list[int] = []
    start = 1
    for k in range(1, parts):
        if start >= len(lengths):
            break
        target = prefix[-1] * k / parts
        cut = min(range(start, len(lengths)), key=lambda j: abs(prefix[j - 1] - target))
        cuts.append(cut)
        start = cut + 1
    bounds = [0, *cuts, len(lengths)]
    return cuts, [cost(lengths[a:b])[1] for a, b in itertools.pairwise(bounds)]


# -- the batcher -------------------------------------------------------------------------
class Batcher:
    """The queue and worker thread of one encoder."""

    def __init__(self, proxy: EncoderProxy, settings: BatchSettings) -> None:
        self._proxy = proxy
        self.settings = settings
        self.model_batch_size = settings.model_batch_size or MODEL_BATCH_SIZE.get(proxy.kind, 32)
        # A configured model_batch_size is used as it is; otherwise the kind may pick per call.
        self._chunk_overhead = None if settings.model_batch_size else CHUNK_OVERHEAD_CHARS.get(proxy.kind)
        self.batches_run = 0
        self.items_run = 0
        self.requests_run = 0
        self.batches_split = 0
        self._reset_state()

    def _reset_state(self) -> None:
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._has_room = threading.Condition(self._lock)
        self._resumed = threading.Condition(self._lock)
        self._pause_lock = threading.Lock()
        self._queue: list[_Request] = []
        self._pending: dict[Hashable, int] = {}  # queued texts per batch key
        self._thread: threading.Thread | None = None
        self._paused = False
        self._retiring = False
        # Whether callers overlap: the last batch had several requests, or one arrived while it ran.
        self._last_batch_requests = 0
        self._arrived_while_running = 0
        self._batch_running = False
        self._free_since = 0.0  # when the worker finished its last batch
        # Requests to expect back once a batch is answered: its own, plus those queued while it ran.
        self._expected = 0
        # Parallel lanes (lazyenc._lanes), owned by the worker thread: their threads, and the
        # replicas of the model they run on, made from the model `_replicas_of` names.
        self._lanes: ThreadPoolExecutor | None = None
        self._lane_shape = (0, 0)  # lanes, torch threads each
        self._replicas: list[Any] = []
        self._replicas_of: weakref.ref[Any] | None = None
        self._parallel: tuple[weakref.ref[Any], int] | None = None

    def __repr__(self) -> str:
        return f"<Batcher {self._proxy.name!r} queued={len(self._queue)} running={self.running}>"

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def is_paused(self) -> bool:
        """True while an unload drains the queue and drops the model."""
        return self._paused

    @property
    def thread_name(self) -> str:
        return f"lazyenc-batch-{self._proxy.name}"

    # -- submitting ------------------------------------------------------------------
    def submit(self, plan: Plan, *, wait: bool) -> Future[Any] | None:
        """Queue a request; its future, or None when an unload paused the queue (call again).

        A full queue raises OverloadedError at once (``wait=False``) or after
        ``queue_timeout_s`` (``wait=True``); with ``wait=True`` a pause is waited out.
        """
        settings = self.settings
        deadline: float | None = None
        from concurrent.futures import Future  # imports logging: kept off `import lazyenc`

        request: _Request = _Request(plan, Future(), 0.0)
        with self._lock:
            while True:
                if self._paused:
                    if wait:
                        while self._paused:
                            self._resumed.wait()
                    return None
                if len(self._queue) < settings.max_queue:
                    break
                if not wait:
                    raise OverloadedError(self._proxy.name, max_queue=settings.max_queue)
                now = time.monotonic()
                if deadline is None:
                    deadline = now + settings.queue_timeout_s
                if now >= deadline:
                    raise OverloadedError(self._proxy.name, max_queue=settings.max_queue)
                self._has_room.wait(deadline - now)
            request.enqueued = time.monotonic()
            if self._batch_running:
                self._arrived_while_running += 1
            self._queue.append(request)
            self._pending[plan.key] = self._pending.get(plan.key, 0) + len(plan.items)
            if self._thread is None:
                self._retiring = False
                self._thread = threading.Thread(target=self._work, name=self.thread_name, daemon=True)
                self._thread.start()
            self._has_work.notify()
        request.future.add_done_callback(_drop_when_cancelled(self, request))
        return request.future

    def _drop(self, request: _Request) -> None:
        """A request cancelled while queued leaves the queue at once."""
        if not request.future.cancelled():
            return
        with self._lock:
            try:
                self._queue.remove(request)
            except ValueError:
                return  # already taken by the worker, which skips it
            self._forget_pending(request.plan.key, len(request.plan.items))
            self._has_room.notify()

    def _forget_pending(self, key: Hashable, n: int) -> None:
        left = self._pending.get(key, 0) - n
        if left > 0:
            self._pending[key] = left
        else:
            self._pending.pop(key, None)

    # -- pausing (unload) -------------------------------------------------------------
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run the queued requests, stop the worker, hold new requests until the block ends."""
        with self._pause_lock:
            with self._lock:
                self._paused = True
                thread = self._thread
                self._has_work.notify_all()
                self._has_room.notify_all()
            if thread is not None and thread is not threading.current_thread():
                thread.join()
            try:
                yield
            finally:
                with self._lock:
                    self._paused = False
                    self._resumed.notify_all()

    def retire(self) -> None:
        """Let the worker end once its queue is empty, without waiting for it.

        Used when the model is dropped by the idle reaper or for the budget,
        which must never block; the next request starts a new worker.
        """
        with self._lock:
            self._retiring = True
            self._has_work.notify_all()

    def stop(self, *, timeout: float = 5.0) -> None:
        """Retire the worker and wait (up to ``timeout``) for it to end: close and exit."""
        self.retire()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def wait_resumed(self) -> None:
        """Block while an unload is in progress."""
        with self._lock:
            while self._paused:
                self._resumed.wait()

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the (absent) worker and the parent's queue without joining.

        The child has no worker thread, and its locks may have been copied while
        held; queued futures belong to the parent's callers and are abandoned.
        """
        self._reset_state()

    # -- the worker ---------------------------------------------------------------------
    def _work(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("batch worker of %s failed", self._proxy.name)
            with self._lock:
                lanes = self._detach_lanes()
                if lanes is not None:
                    lanes.shutdown(wait=False)
                orphans, self._queue = self._queue, []
                self._pending.clear()
                if self._thread is threading.current_thread():
                    self._thread = None
                self._has_room.notify_all()
            for request in orphans:
                if request.future.set_running_or_notify_cancel():
                    request.future.set_exception(exc)

    def _serve(self) -> None:
        lanes: ThreadPoolExecutor | None = None
        while True:
            with self._lock:
                if self._batch_running:
                    self._batch_running = False
                    self._free_since = time.monotonic()
                while not self._queue and not self._paused and not self._retiring:
                    # An idle worker ends after a while: a manager dropped without close()
                    # must not keep a thread (and through it the model) alive forever.
                    if not self._has_work.wait(WORKER_IDLE_EXIT_S) and not self._queue:
                        self._retiring = True
                if not self._queue:  # paused, retired or idle, and drained
                    # Lanes end with their worker: no lane thread and no replica outlive an
                    # unload (which joins this thread) or an idle exit.
                    lanes = self._detach_lanes()
                    if self._thread is threading.current_thread():
                        self._thread = None
                    break
                batch = self._collect()
                self._has_room.notify_all()
            if batch:
                self._run(batch)
        if lanes is not None:
            lanes.shutdown(wait=True)

    def _collect(self) -> list[_Request]:
        """Take one batch off the queue (lock held), waiting up to max_wait_ms to fill it."""
        max_size = self.settings.max_size
        # A lone caller is not delayed: waiting only pays when calls overlap.
        overlapping = self._last_batch_requests > 1 or self._arrived_while_running > 0
        if not self._paused and self.settings.max_wait_ms > 0 and overlapping:
            # The batch stays open max_wait_ms from when it could first have run: the oldest
            # request's arrival or the end of the previous batch, whichever is later. Counting
            # from the end of the previous batch lets the callers it just answered join the
            # next one, instead of settling into cohorts that alternate half-size batches.
            opened = max(self._queue[0].enqueued, self._free_since)
            deadline = opened + self.settings.max_wait_ms / 1000
            while self._queue and not self._paused:
                if self._pending.get(self._queue[0].plan.key, 0) >= max_size:
                    break
                # Every caller of the last batch is back, and those who queued while it ran:
                # nobody else is due, so waiting out the window would only delay them.
                if len(self._queue) >= self._expected:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._has_work.wait(remaining)
            if not self._queue:  # all cancelled while we waited
                return []
        key = self._queue[0].plan.key
        taken: list[_Request] = []
        kept: list[_Request] = []
        size = 0
        for request in self._queue:
            n = len(request.plan.items)
            if request.plan.key == key and (not taken or size + n <= max_size):
                taken.append(request)
                size += n
            else:
                kept.append(request)
        self._queue = kept
        self._forget_pending(key, size)
        self._last_batch_requests = len(taken)
        self._arrived_while_running = 0
        self._batch_running = True
        return taken

    def _run(self, batch: list[_Request]) -> None:
        # A request cancelled before this point is dropped; after it, it runs.
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        plan = live[0].plan
        parts = self._parts(live)
        try:
            outcomes: list[tuple[Any, BaseException | None]] = []
            if len(parts) > 1:
                try:
                    outcomes = self._run_parts(parts, plan)
                except Exception:  # lazyenc's own (no thread, no copy): the model's are in outcomes
                    log.exception("encoder %r: parallel lanes failed; batches run whole", self._proxy.name)
                    self._parallel = _remembered(self._proxy._model, 1)
                    parts = [_Part(live)]
            if not outcomes:
                outcomes = [self._run_whole(parts[0], plan)]
        finally:
            self.batches_run += 1
            self.batches_split += len(parts) > 1
            self.items_run += sum(len(part.items) for part in parts)
            self.requests_run += len(live)
        with self._lock:  # before any caller of this batch can queue its next request
            self._expected = len(live) + len(self._queue)
        for part, (out, exc) in zip(parts, outcomes, strict=True):
            part.deliver(out, exc)

    def _run_whole(self, part: _Part, plan: Plan) -> tuple[Any, BaseException | None]:
        try:
            # Each request of the batch already counts as in flight (see call/acall).
            return self._proxy._invoke(
                self._forward, plan.method, part.items, plan.kwargs, len(part.requests)
            ), None
        except BaseException as exc:
            return None, exc  # the model's own exception, unchanged, to every caller

    def _run_parts(self, parts: list[_Part], plan: Plan) -> list[tuple[Any, BaseException | None]]:
        """Run the parts at once, the first on the model, the others on its replicas."""
        proxy = self._proxy
        model = proxy._model
        lanes = self._lanes_for(len(parts))
        replicas = self._replicas_for(model, len(parts) - 1)
        # The model itself runs the first part: no unbatched call may use it meanwhile.
        with proxy._call_lock:
            futures = [
                lanes.submit(self._call_model, copy, plan.method, part.items, plan.kwargs, part.batch_size)
                for copy, part in zip((model, *replicas), parts, strict=True)
            ]
            del replicas
            outcomes: list[tuple[Any, BaseException | None]] = []
            for part, future in zip(parts, futures, strict=True):
                exc = future.exception()
                outcomes.append((None, exc) if exc is not None else (future.result(), None))
                proxy._calls += len(part.requests)
                proxy._errors += len(part.requests) if exc is not None else 0
            proxy._last_used_at = time.time()
        return outcomes

    def _parts(self, live: list[_Request]) -> list[_Part]:
        """The batch as the calls that run at once: one call unless it splits across lanes."""
        texts = sum(len(request.plan.items) for request in live)
        model = self._proxy._model
        if len(live) < 2 or texts < MIN_SPLIT_TEXTS or model is None:
            return [_Part(live)]
        parts = self._parallel_for(model)
        if parts < 2:
            return [_Part(live)]
        measured = sorted(
            ((request, [_length(item) for item in request.plan.items]) for request in live),
            key=lambda pair: -max(pair[1]),
        )
        ranked = [request for request, _ in measured]
        lengths = [texts for _, texts in measured]
        kind = self._proxy.kind
        if self._chunk_overhead is not None and kind in LANE_PASS_CHARS:
            cuts, sizes = split(
                lengths,
                parts=parts,
                overhead=LANE_PASS_CHARS[kind],
                per_text=LANE_TEXT_CHARS[kind],
                largest=self.model_batch_size,
            )
        else:  # a fixed chunk size: parts of about equal characters
            cuts, _ = split(lengths, parts=parts, overhead=0, per_text=0, largest=texts)
            sizes = []
        bounds = [0, *cuts, len(ranked)]
        groups = [ranked[start:end] for start, end in itertools.pairwise(bounds)]
        return [_Part(group, *sizes[i : i + 1]) for i, group in enumerate(groups)]

    def _parallel_for(self, model: Any) -> int:
        """How many parts a batch on this model may run in (1 when lanes cannot be used)."""
        known = self._parallel
        if known is not None and known[0]() is model:
            return known[1]
        parts = self.settings.parallel
        if parts is None:
            # Not sparse: SPLADE's [chunk, tokens, 30522] activations make it memory-bound, and
            # two lanes were 8 to 19 % slower than one (docs/batching.md#parallel-lanes).
            auto = self._proxy.kind in LANE_PASS_CHARS
            parts = auto_parallel(model, self._proxy._device) if auto else 1
        if parts > 1:
            try:
                self._replicas_for(model, parts - 1)
            except Exception as exc:
                log.warning(
                    "encoder %r: batch.parallel = %d needs copies of the model, which failed "
                    "(%s: %s); its batches run whole",
                    self._proxy.name,
                    parts,
                    type(exc).__name__,
                    exc,
                )
                parts = 1
        self._parallel = _remembered(model, parts)
        # A model without weak references runs whole: nothing could tell its replicas are stale.
        return 1 if self._parallel is None else parts

    def _replicas_for(self, model: Any, count: int) -> list[Any]:
        source = self._replicas_of
        if source is None or source() is not model:
            self._replicas = []
            self._replicas_of = weakref.ref(model)
        while len(self._replicas) < count:
            self._replicas.append(replicate(model))
        return self._replicas[:count]

    def _lanes_for(self, parts: int) -> ThreadPoolExecutor:
        # The worker's own torch threads, shared out among the lanes.
        threads = max(1, torch_threads() // parts)
        lanes = self._lanes
        if lanes is None or self._lane_shape != (parts, threads):
            from concurrent.futures import ThreadPoolExecutor

            if lanes is not None:
                lanes.shutdown(wait=True)
            lanes = self._lanes = ThreadPoolExecutor(
                max_workers=parts,
                thread_name_prefix=f"lazyenc-lane-{self._proxy.name}",
                initializer=limit_this_thread,
                initargs=(threads,),
            )
            self._lane_shape = (parts, threads)
        return lanes

    def _detach_lanes(self) -> ThreadPoolExecutor | None:
        """Forget the lanes and replicas (lock held); the lanes, for the caller to shut down."""
        lanes, self._lanes = self._lanes, None
        self.drop_replicas()
        return lanes

    def drop_replicas(self) -> None:
        """Forget the model's replicas, so that unloading it returns its memory."""
        self._replicas = []
        self._replicas_of = None
        self._parallel = None

    def batch_size_for(self, items: list[Any]) -> int:
        """The batch_size a model call on ``items`` (sorted longest first) gets."""
        if self._chunk_overhead is None:
            return max(1, min(len(items), self.model_batch_size))
        lengths = [_length(item) for item in items]
        return chunk_size(lengths, overhead=self._chunk_overhead, largest=self.model_batch_size)

    def _call_model(
        self,
        model: Any,
        method: str,
        items: list[Any],
        kwargs: Mapping[str, Any],
        batch_size: int | None = None,
    ) -> Any:
        size = batch_size or self.batch_size_for(items)
        return getattr(model, method)(items, batch_size=size, show_progress_bar=False, **kwargs)

    def _forward(
        self, model: Any, method: str, items: list[Any], kwargs: Mapping[str, Any], requests: int
    ) -> Any:
        # Runs under the proxy's call lock; calls and errors count requests, not batches.
        proxy = self._proxy
        proxy._calls += requests - 1
        try:
            return self._call_model(model, method, items, kwargs)
        except BaseException:
            proxy._errors += requests - 1
            raise


class _Part:
    """Requests that run as one model call: their texts sorted longest first, and where each went."""

    __slots__ = ("requests", "items", "starts", "position", "batch_size")

    def __init__(self, requests: list[_Request], batch_size: int | None = None) -> None:
        self.batch_size = batch_size  # None: Batcher.batch_size_for(items)
        items: list[Any] = []
        self.starts: list[int] = []
        for request in requests:
            self.starts.append(len(items))
            items.extend(request.plan.items)
        order = sorted(range(len(items)), key=lambda i: -_length(items[i]))
        self.position = [0] * len(items)
        for pos, index in enumerate(order):
            self.position[index] = pos
        self.requests = requests
        self.items = [items[i] for i in order]

    def deliver(self, out: Any, exc: BaseException | None) -> None:
        for request, start in zip(self.requests, self.starts, strict=True):
            if exc is not None:
                request.future.set_exception(exc)
                continue
            rows = [self.position[start + k] for k in range(len(request.plan.items))]
            try:
                request.future.set_result(_take(out, rows, request.plan.singular))
            except BaseException as error:
                request.future.set_exception(error)


def _remembered(model: Any, parts: int) -> tuple[weakref.ref[Any], int] | None:
    """The lane count of a model, kept while that model lives; None if it takes no weak reference."""
    try:
        return (weakref.ref(model), parts)
    except TypeError:
        return None


def _drop_when_cancelled(batcher: Batcher, request: _Request) -> Callable[[Future[Any]], None]:
    return lambda _future: batcher._drop(request)


# -- the proxy side ----------------------------------------------------------------------
def make_batcher(proxy: EncoderProxy) -> Batcher | None:
    """A batcher for a dense, sparse or rerank proxy with batching on; None otherwise."""
    settings = proxy.settings.batch
    if proxy.kind not in BATCHED_KINDS or not settings.enabled:
        return None
    return Batcher(proxy, settings)


def paused(batcher: Batcher | None) -> contextlib.AbstractContextManager[None]:
    """Drain and stop the batcher's worker for the duration of an unload."""
    return contextlib.nullcontext() if batcher is None else batcher.paused()


def status_fields(batcher: Batcher | None) -> dict[str, Any]:
    """The batching fields of ComponentStatus."""
    if batcher is None:
        return {}
    runs = batcher.batches_run
    return {
        "batches_run": runs,
        "mean_batch_size": round(batcher.items_run / runs, 2) if runs else None,
        "queue_depth": batcher.queue_depth,
    }


def call(proxy: EncoderProxy, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A model call from a thread: batched when it can be, else the serialised path."""
    batcher = proxy._batcher
    plan = None if batcher is None else plan_call(proxy, method, args, kwargs)
    if batcher is None or plan is None:
        return proxy._call(method, *args, **kwargs)
    proxy._begin_call()  # a queued request counts as in flight: no idle unload under it
    try:
        while True:
            proxy.load()
            future = batcher.submit(plan, wait=True)
            if future is not None:
                return plan.result(future.result())
    finally:
        proxy._end_call()


async def acall(proxy: EncoderProxy, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A model call from a coroutine; never blocks the event loop (a build runs in a thread)."""
    import asyncio

    batcher = proxy._batcher
    plan = None if batcher is None else plan_call(proxy, method, args, kwargs)
    if batcher is None or plan is None:
        return await asyncio.to_thread(proxy._call, method, *args, **kwargs)
    proxy._begin_call()
    try:
        while True:
            if proxy.peek() is None or batcher.is_paused:
                await asyncio.to_thread(_ready, proxy, batcher)
            future = batcher.submit(plan, wait=False)
            if future is not None:
                return plan.result(await asyncio.wrap_future(future))
    finally:
        proxy._end_call()


def _ready(proxy: EncoderProxy, batcher: Batcher) -> None:
    batcher.wait_resumed()
    proxy.load()


async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking call in the default executor (spaCy, decode)."""
    import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)
