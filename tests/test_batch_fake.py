"""Batching behaviour that real models cannot show deterministically: a fake
model whose forward pass blocks on an Event holds the worker while requests
queue up behind it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from lazyenc import (
    BatchSettings,
    ConfigError,
    EncoderClosedError,
    EncoderManager,
    InvalidInputError,
    OverloadedError,
    _batching,
    parse_config,
)
from lazyenc.testing import FakeLoader, FakeModel, make_settings


@dataclasses.dataclass
class Gated:
    """A manager with one fake encoder whose model calls wait for ``gate``."""

    manager: EncoderManager
    model: FakeModel
    gate: threading.Event
    loader: FakeLoader
    threads: list[threading.Thread] = dataclasses.field(default_factory=list)
    blocker_outcome: list[Any] = dataclasses.field(default_factory=list)

    @property
    def proxy(self) -> Any:
        return self.manager["enc"]

    def block_worker(self) -> None:
        """Start a call in a thread and return once the worker is inside the model."""

        def blocker() -> None:
            try:
                self.blocker_outcome.append(self.proxy.encode("blocker"))
            except Exception as exc:
                self.blocker_outcome.append(exc)

        thread = threading.Thread(target=blocker)
        thread.start()
        self.threads.append(thread)
        assert self.model.entered.wait(timeout=30)

    def release(self) -> None:
        self.gate.set()
        for thread in self.threads:
            thread.join()


def gated(kind: str = "dense", **batch: Any) -> Gated:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    loader = FakeLoader(model_factory=lambda: model)
    settings = make_settings({"enc": kind})
    enc = settings.encoders[0].replace(batch=BatchSettings(**batch))
    manager = EncoderManager(settings.replace(encoders=(enc,)), loaders={"enc": loader})
    manager["enc"].load()
    return Gated(manager, model, gate, loader)


@pytest.fixture
def g() -> Iterator[Gated]:
    fixture = gated()
    yield fixture
    fixture.gate.set()
    fixture.manager.close()


def reference(inputs: Any) -> Any:
    return FakeModel().encode(inputs)


async def queued(proxy: Any, n: int) -> None:
    """Let freshly created tasks reach the queue."""
    for _ in range(10):
        if proxy._batcher.queue_depth >= n:
            return
        await asyncio.sleep(0)
    assert n == proxy._batcher.queue_depth


async def test_queued_requests_share_one_model_call_and_keep_their_order(g: Gated) -> None:
    """Requests queued behind a running batch run together and each gets its own rows in order."""
    g.block_worker()
    inputs: list[Any] = ["a", ["bb", "c"], "dddd", ["e", "ffffff", "gg"]]
    tasks = [asyncio.create_task(g.proxy.aencode(x)) for x in inputs]
    await queued(g.proxy, 4)
    g.release()
    results = await asyncio.gather(*tasks)
    assert [reference(x) for x in inputs] == results
    assert 2 == len(g.model.seen)
    assert ["ffffff", "dddd", "bb", "gg", "a", "c", "e"] == g.model.seen[1]


async def test_sync_and_async_callers_share_a_batch(g: Gated) -> None:
    """A thread's call and a task's call queued together run in one model call."""
    g.block_worker()
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(sync=g.proxy.encode("from a thread")))
    thread.start()
    await asyncio.to_thread(lambda: None)
    task = asyncio.create_task(g.proxy.aencode("from a task"))
    await queued(g.proxy, 2)
    g.release()
    assert reference("from a task") == await task
    await asyncio.to_thread(thread.join)
    assert reference("from a thread") == box["sync"]
    assert 2 == len(g.model.seen)


async def test_requests_with_different_options_run_in_separate_batches(g: Gated) -> None:
    """Only calls with equal output-changing options share a batch."""
    g.block_worker()
    tasks = [
        asyncio.create_task(g.proxy.aencode("one", normalize_embeddings=True)),
        asyncio.create_task(g.proxy.aencode("two", truncate_dim=4)),
        asyncio.create_task(g.proxy.aencode("three", normalize_embeddings=True, batch_size=7)),
        asyncio.create_task(g.proxy.aencode("four", normalize_embeddings=1)),
    ]
    await queued(g.proxy, 4)
    g.release()
    await asyncio.gather(*tasks)
    assert [["three", "one"], ["two"], ["four"]] == g.model.seen[1:]


async def test_request_larger_than_the_batch_room_waits_for_the_next_batch() -> None:
    """A batch holds at most max_size texts; a request is never split."""
    fixture = gated(max_size=5)
    try:
        fixture.block_worker()
        tasks = [asyncio.create_task(fixture.proxy.aencode([f"t{i}", f"u{i}"])) for i in range(3)]
        await queued(fixture.proxy, 3)
        fixture.release()
        assert [reference([f"t{i}", f"u{i}"]) for i in range(3)] == await asyncio.gather(*tasks)
        assert [4, 2] == [len(seen) for seen in fixture.model.seen[1:]]
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_bad_input_fails_alone_before_the_batch(g: Gated) -> None:
    """A non-string input raises InvalidInputError at once; the others in its batch succeed."""
    g.block_worker()
    good = [asyncio.create_task(g.proxy.aencode(t)) for t in ("x", "y")]
    await queued(g.proxy, 2)
    with pytest.raises(InvalidInputError) as info:
        await g.proxy.aencode(["fine", 42])
    assert "encoder 'enc': inputs[1] must be a str, got int 42" == str(info.value)
    assert 2 == g.proxy._batcher.queue_depth
    g.release()
    assert [reference("x"), reference("y")] == await asyncio.gather(*good)


@pytest.mark.parametrize(
    ("method", "args", "message"),
    [
        ("encode", (None,), "inputs must be a str or a list of str, got NoneType None"),
        ("encode", (["a", b"b"],), "inputs[1] must be a str, got bytes b'b'"),
        ("encode_query", ([1.5],), "inputs[0] must be a str, got float 1.5"),
    ],
)
def test_invalid_dense_input_names_the_argument(g: Gated, method: str, args: Any, message: str) -> None:
    """The error says which argument (and which element) is wrong."""
    with pytest.raises(InvalidInputError) as info:
        getattr(g.proxy, method)(*args)
    assert f"encoder 'enc': {message}" == str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("method", "args", "message"),
    [
        (
            "predict",
            ("just a string",),
            "inputs must be a (query, document) pair or a list of pairs, got str",
        ),
        ("predict", ([("q", "d"), ("q",)],), "inputs[1] must be a (query, document) pair, got ('q',)"),
        ("predict", ([("q", None)],), "inputs[0] must hold two str, got NoneType None"),
        ("rank", (7, ["d"]), "query must be a str, got int"),
        ("rank", ("q", ["d", None]), "documents[1] must be a str, got NoneType None"),
    ],
)
def test_invalid_rerank_input_names_the_argument(method: str, args: Any, message: str) -> None:
    """predict and rank check pairs, query and documents before queueing."""
    fixture = gated("rerank")
    fixture.gate.set()
    with fixture.manager, pytest.raises(InvalidInputError) as info:
        getattr(fixture.proxy, method)(*args)
    assert f"encoder 'enc': {message}" == str(info.value)


async def test_forward_failure_reaches_every_caller_and_the_worker_keeps_serving(g: Gated) -> None:
    """The model's exception object reaches each caller of its batch unchanged; later calls work."""
    g.block_worker()
    boom = RuntimeError("forward failed")
    tasks = [asyncio.create_task(g.proxy.aencode(t)) for t in ("a", "b", "c")]
    await queued(g.proxy, 3)
    g.model.fail = boom
    g.release()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [boom, boom, boom] == results
    assert all(r is boom for r in results)
    assert [boom] == g.blocker_outcome
    g.model.fail = None
    assert reference("after") == await g.proxy.aencode("after")
    assert reference(["sync", "too"]) == g.proxy.encode(["sync", "too"])
    assert 4 == g.proxy.status().errors


async def test_cancelled_request_is_dropped_before_its_batch_runs(g: Gated) -> None:
    """Cancelling a queued task removes its texts from the batch."""
    g.block_worker()
    keep = asyncio.create_task(g.proxy.aencode("keep"))
    drop = asyncio.create_task(g.proxy.aencode("drop"))
    await queued(g.proxy, 2)
    drop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drop
    assert 1 == g.proxy._batcher.queue_depth
    g.release()
    assert reference("keep") == await keep
    assert [["keep"]] == g.model.seen[1:]


async def test_full_queue_fails_async_callers_at_once() -> None:
    """With max_queue requests waiting, a coroutine gets OverloadedError without waiting."""
    fixture = gated(max_queue=2, queue_timeout_s=60)
    try:
        fixture.block_worker()
        tasks = [asyncio.create_task(fixture.proxy.aencode(t)) for t in ("a", "b")]
        await queued(fixture.proxy, 2)
        with pytest.raises(OverloadedError) as info:
            await fixture.proxy.aencode("c")
        assert "encoder 'enc' is overloaded: 2 requests already queued" == str(info.value)
        fixture.release()
        assert [reference("a"), reference("b")] == await asyncio.gather(*tasks)
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_full_queue_fails_sync_callers_after_queue_timeout() -> None:
    """A thread waits up to queue_timeout_s for room, then gets OverloadedError."""
    fixture = gated(max_queue=1, queue_timeout_s=0.05)
    try:
        fixture.block_worker()
        task = asyncio.create_task(fixture.proxy.aencode("a"))
        await queued(fixture.proxy, 1)
        with pytest.raises(OverloadedError):
            await asyncio.to_thread(fixture.proxy.encode, "b")
        fixture.release()
        assert reference("a") == await task
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_sync_caller_gets_room_when_the_queue_drains() -> None:
    """A thread waiting for room is served once the worker takes the queue."""
    fixture = gated(max_queue=1, queue_timeout_s=60)
    try:
        fixture.block_worker()
        task = asyncio.create_task(fixture.proxy.aencode("a"))
        await queued(fixture.proxy, 1)
        waiting = asyncio.create_task(asyncio.to_thread(fixture.proxy.encode, "b"))
        fixture.release()
        assert [reference("a"), reference("b")] == [await task, await waiting]
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_status_shows_batches_mean_size_and_queue_depth(g: Gated) -> None:
    """ComponentStatus counts batches, texts per batch and waiting requests; calls count requests."""
    before = g.proxy.status()
    assert (0, None, 0) == (before.batches_run, before.mean_batch_size, before.queue_depth)
    g.block_worker()
    tasks = [asyncio.create_task(g.proxy.aencode(x)) for x in (["a", "b"], "c", ["d", "e", "f"])]
    await queued(g.proxy, 3)
    assert 3 == g.proxy.status().queue_depth
    assert 3 == g.proxy.status().as_dict()["queue_depth"]
    g.release()
    await asyncio.gather(*tasks)
    status = g.proxy.status()
    assert (2, 3.5, 0, 4) == (status.batches_run, status.mean_batch_size, status.queue_depth, status.calls)


_BASELINE: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _threads_before_the_test() -> None:
    """Remember the threads alive before each test (other tests' managers may still run theirs)."""
    _BASELINE.clear()
    _BASELINE.update(threading.enumerate())


def worker_threads() -> list[str]:
    return [
        t.name for t in threading.enumerate() if t.name.startswith("lazyenc-batch-") and t not in _BASELINE
    ]


async def test_unload_runs_queued_requests_then_stops_the_worker(g: Gated) -> None:
    """Unload drains the queue (every caller gets its result), then the worker thread ends."""
    g.block_worker()
    tasks = [asyncio.create_task(g.proxy.aencode(t)) for t in ("a", "b")]
    await queued(g.proxy, 2)
    unloading = asyncio.create_task(asyncio.to_thread(g.proxy.unload))
    await asyncio.to_thread(lambda: None)
    g.release()
    assert [reference("a"), reference("b")] == await asyncio.gather(*tasks)
    assert await unloading is True
    assert [] == worker_threads()
    assert "idle" == g.proxy.state


async def test_call_during_unload_waits_for_the_next_build(g: Gated) -> None:
    """A call arriving while an unload drains waits, then builds the model again."""
    g.block_worker()
    unloading = asyncio.create_task(asyncio.to_thread(g.proxy.unload))
    for _ in range(1000):
        if g.proxy._batcher.is_paused:
            break
        await asyncio.to_thread(lambda: None)
    assert g.proxy._batcher.is_paused
    late_sync = asyncio.create_task(asyncio.to_thread(g.proxy.encode, "late thread"))
    late_async = asyncio.create_task(g.proxy.aencode("late task"))
    await asyncio.sleep(0)
    assert not late_async.done()
    g.release()
    assert await unloading is True
    assert [reference("late thread"), reference("late task")] == [await late_sync, await late_async]
    assert 2 == g.loader.builds


async def test_close_serves_queued_requests_then_refuses_new_ones(g: Gated) -> None:
    """close() drains the queue; later calls raise EncoderClosedError."""
    g.block_worker()
    task = asyncio.create_task(g.proxy.aencode("queued"))
    await queued(g.proxy, 1)
    closing = asyncio.create_task(asyncio.to_thread(g.manager.close))
    await asyncio.to_thread(lambda: None)
    g.release()
    await closing
    assert reference("queued") == await task
    with pytest.raises(EncoderClosedError):
        await g.proxy.aencode("late")
    with pytest.raises(EncoderClosedError):
        g.proxy.encode("late")
    assert [] == worker_threads()


async def test_first_async_call_builds_off_the_event_loop() -> None:
    """The first-use build of an async call runs in a worker thread, not the loop's."""
    built_in: list[threading.Thread] = []

    def factory() -> FakeModel:
        built_in.append(threading.current_thread())
        return FakeModel()

    manager = EncoderManager(
        make_settings({"enc": "dense"}), loaders={"enc": FakeLoader(model_factory=factory)}
    )
    with manager:
        assert reference("x") == await manager["enc"].aencode("x")
        assert [threading.current_thread()] != built_in
        assert 1 == len(built_in)


def test_batch_false_serves_calls_without_a_worker() -> None:
    """With batching off, calls take the serialised path and no thread starts."""
    settings = make_settings({"enc": "dense"})
    enc = settings.encoders[0].replace(batch=BatchSettings(enabled=False))
    manager = EncoderManager(settings.replace(encoders=(enc,)), loaders={"enc": FakeLoader()})
    with manager:
        assert reference(["a", "b"]) == manager["enc"].encode(["a", "b"])
        assert reference("a") == asyncio.run(manager["enc"].aencode("a"))
        assert [] == worker_threads()
        assert (0, None) == (manager["enc"].status().batches_run, manager["enc"].status().mean_batch_size)


@pytest.mark.parametrize(
    "kwargs",
    [{"prompt": {"unhashable": {1, 2}}}, {"device": "cpu"}, {"precision": "int8"}, {"not_an_option": 1}],
)
def test_unbatchable_options_take_the_serialised_path(g: Gated, kwargs: dict[str, Any]) -> None:
    """Unhashable, unknown or batch-dependent options go to the model unbatched."""
    g.gate.set()
    assert reference(["a"]) == g.proxy.encode(["a"], **kwargs)
    assert 0 == g.proxy.status().batches_run


def test_rank_pairs_share_batches_with_predict() -> None:
    """rank builds on batched predict and keeps CrossEncoder.rank's result shape."""
    fixture = gated("rerank")
    with fixture.manager:
        fixture.gate.set()
        proxy = fixture.proxy
        expected = FakeModel().rank("red fox", ["a fox", "red fox", "dog"], top_k=2, return_documents=True)
        assert expected == proxy.rank("red fox", ["a fox", "red fox", "dog"], top_k=2, return_documents=True)
        assert [0.5, 0.0] == proxy.predict([("red fox", "a fox"), ("x", "y")])
        assert 2 == proxy.status().batches_run


def test_forget_after_fork_lets_a_forked_child_encode(g: Gated) -> None:
    """In a forked child, the batcher drops the parent's worker and starts its own."""
    g.gate.set()
    assert reference("parent") == g.proxy.encode("parent")
    assert g.proxy._batcher.running
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        ok = False
        try:
            g.proxy._batcher._forget_after_fork()
            ok = reference("child") == g.proxy.encode("child")
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert 0 == os.waitstatus_to_exitcode(status)
    assert reference("parent again") == g.proxy.encode("parent again")


def test_queue_timeout_and_model_batch_size_are_read_from_the_toml() -> None:
    """batch.queue_timeout_s is a number >= 0 (default 10); batch.model_batch_size an integer > 0."""
    settings = parse_config(
        '[encoders.a]\nkind = "dense"\nmodel = "m"\n'
        "batch = { max_queue = 8, queue_timeout_s = 0, model_batch_size = 4 }\n"
        '[encoders.b]\nkind = "dense"\nmodel = "m"\n'
    )
    assert BatchSettings(max_queue=8, queue_timeout_s=0.0, model_batch_size=4) == settings.encoder("a").batch
    assert (10.0, None) == (
        settings.encoder("b").batch.queue_timeout_s,
        settings.encoder("b").batch.model_batch_size,
    )
    with pytest.raises(ConfigError) as info:
        parse_config('[encoders.a]\nkind = "dense"\nmodel = "m"\nbatch = { model_batch_size = 0 }\n')
    assert "<string>: [encoders.a.batch.model_batch_size]: must be > 0, got 0" == str(info.value)


@pytest.mark.parametrize(
    ("kind", "configured", "expected"), [("dense", None, 3), ("dense", 2, 2), ("sparse", None, 3)]
)
async def test_coalesced_call_passes_the_model_batch_size(
    kind: str, configured: int | None, expected: int
) -> None:
    """The model gets batch_size = min(texts, model_batch_size or the kind's default), not the caller's."""
    fixture = gated(kind, model_batch_size=configured)
    try:
        fixture.block_worker()
        tasks = [asyncio.create_task(fixture.proxy.aencode(t, batch_size=1)) for t in ("a", "b", "c")]
        await queued(fixture.proxy, 3)
        fixture.release()
        await asyncio.gather(*tasks)
        assert expected == fixture.model.seen_kwargs[1]["batch_size"]
    finally:
        fixture.gate.set()
        fixture.manager.close()


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ([50] * 32, 32),  # equal lengths: one chunk, no padding to save
        ([120] * 8 + [30] * 8, 8),  # two length groups: one chunk each
        ([35] * 2 + [30] * 30, 32),  # a little padding costs less than another pass
        ([40] * 100, 50),  # never more than `largest` texts a chunk
        ([7], 1),
        ([], 1),
    ],
)
def test_chunk_size_splits_mixed_lengths_where_padding_costs_more_than_a_pass(
    lengths: list[int], expected: int
) -> None:
    """A coalesced call's chunk size trades padding against one more forward pass."""
    assert expected == _batching.chunk_size(lengths, overhead=250, largest=64)


async def test_coalesced_call_of_mixed_lengths_runs_length_sorted_chunks() -> None:
    """Dense texts of two length groups, queued together, reach the model as chunks of one group each."""
    fixture = gated("dense")
    try:
        fixture.block_worker()
        texts = ["x" * 120] * 8 + ["y" * 30] * 8
        tasks = [asyncio.create_task(fixture.proxy.aencode(t)) for t in texts]
        await queued(fixture.proxy, 16)
        fixture.release()
        assert [reference(t) for t in texts] == await asyncio.gather(*tasks)
        assert 8 == fixture.model.seen_kwargs[1]["batch_size"]
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_worker_bug_fails_queued_requests_instead_of_hanging(
    g: Gated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the worker itself breaks, queued callers get the error and a later call starts a new worker."""
    g.gate.set()
    bug = RuntimeError("worker bug")

    def broken() -> list[Any]:
        raise bug

    monkeypatch.setattr(g.proxy._batcher, "_collect", broken)
    with pytest.raises(RuntimeError) as info:
        await g.proxy.aencode("a")
    assert bug is info.value
    monkeypatch.undo()
    assert reference("b") == await g.proxy.aencode("b")


def finishes(fn: Any, *args: Any) -> bool:
    """Whether fn(*args) returns within a minute (a liveness check, not a speed limit)."""
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    thread.join(timeout=60)
    return not thread.is_alive()


def test_lone_caller_is_not_delayed_by_max_wait() -> None:
    """A caller alone (last batch of one, nothing arriving meanwhile) runs without waiting max_wait_ms."""
    fixture = gated(max_wait_ms=3_600_000)
    fixture.gate.set()
    with fixture.manager:
        assert all(finishes(fixture.proxy.encode, f"call {i}") for i in range(3))
        assert 3 == fixture.proxy.status().batches_run


async def test_a_full_batch_runs_without_waiting_out_max_wait() -> None:
    """Once max_size texts with one key are queued, the batch runs before max_wait_ms expires."""
    fixture = gated(max_wait_ms=3_600_000, max_size=3)
    try:
        fixture.block_worker()
        tasks = [asyncio.create_task(fixture.proxy.aencode(t)) for t in ("a", "b", "c")]
        await queued(fixture.proxy, 3)
        fixture.release()
        assert [reference(t) for t in "abc"] == await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_the_next_batch_runs_once_every_caller_of_the_last_one_is_back() -> None:
    """When the last batch's caller and those queued during it are all back, the batch runs at once."""
    fixture = gated(max_wait_ms=3_600_000)
    answers: list[Any] = []
    repeat = threading.Thread(target=lambda: answers.extend(fixture.proxy.encode(f"r{i}") for i in range(2)))
    try:
        repeat.start()
        assert fixture.model.entered.wait(timeout=30)  # its first call holds the worker
        tasks = [asyncio.create_task(fixture.proxy.aencode(t)) for t in ("a", "b")]
        await queued(fixture.proxy, 2)
        fixture.gate.set()  # "r0" is answered, and "r1" joins "a" and "b"
        assert [reference("a"), reference("b")] == await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await asyncio.to_thread(repeat.join)
        assert [reference("r0"), reference("r1")] == answers
        assert [["r0"], ["a", "b", "r1"]] == [sorted(seen) for seen in fixture.model.seen]
    finally:
        fixture.gate.set()
        fixture.manager.close()


async def test_mixed_load_with_unloads_and_cancellations_answers_every_request() -> None:
    """Threads, tasks, cancellations and repeated unloads together: every request gets its own result."""
    settings = make_settings({"enc": "dense"})
    enc = settings.encoders[0].replace(batch=BatchSettings(max_size=8, max_wait_ms=1))
    manager = EncoderManager(settings.replace(encoders=(enc,)), loaders={"enc": FakeLoader()})
    proxy = manager["enc"]
    mismatches: list[Any] = []

    def thread_caller(i: int) -> None:
        for k in range(40):
            x: Any = [f"t{i}-{k}", f"u{i}-{k}"] if k % 2 else f"s{i}-{k}"
            if reference(x) != proxy.encode(x, normalize_embeddings=k % 3 == 0):
                mismatches.append(x)

    def unloader() -> None:
        for _ in range(15):
            proxy.unload()

    async def task_caller(j: int) -> None:
        if reference(f"a{j}") != await proxy.aencode(f"a{j}"):
            mismatches.append(j)

    with manager:
        threads = [threading.Thread(target=thread_caller, args=(i,)) for i in range(8)]
        threads.append(threading.Thread(target=unloader))
        for t in threads:
            t.start()
        for round_ in range(10):
            tasks = [asyncio.create_task(task_caller(round_ * 100 + j)) for j in range(20)]
            await asyncio.sleep(0)
            for t in tasks[::5]:
                t.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(o is None or isinstance(o, asyncio.CancelledError) for o in outcomes)
        for t in threads:
            await asyncio.to_thread(t.join)
        assert [] == mismatches
        assert 0 == proxy.status().queue_depth
    assert [] == worker_threads()


def test_an_idle_worker_ends_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker with no work ends after WORKER_IDLE_EXIT_S, so an unclosed manager leaks no thread; the next call starts one."""
    monkeypatch.setattr(_batching, "WORKER_IDLE_EXIT_S", 0.05)
    mgr = EncoderManager(make_settings({"dense": "dense"}), loaders={"dense": FakeLoader()})
    mgr["dense"].encode(["x"])
    started = [t for t in threading.enumerate() if t.name == "lazyenc-batch-dense" and t not in _BASELINE]
    for thread in started:
        thread.join(60)  # a guard against a hang, not a timing check
    assert [] == worker_threads()
    assert reference(["y"]) == mgr["dense"].encode(["y"])
    mgr.close()


def test_idle_unload_also_ends_the_batch_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the idle reaper unloads a model its batch worker ends too, and the next call builds again."""
    monkeypatch.setattr(_batching, "WORKER_IDLE_EXIT_S", 3600.0)  # only the unload may end it
    loader = FakeLoader()
    mgr = EncoderManager(make_settings({"dense": "dense"}, idle_unload_s=0.05), loaders={"dense": loader})
    mgr["dense"].encode(["x"])
    for thread in [
        t for t in threading.enumerate() if t.name == "lazyenc-batch-dense" and t not in _BASELINE
    ]:
        thread.join(60)  # a guard against a hang, not a timing check
    assert ("idle", []) == (mgr["dense"].state, worker_threads())
    assert reference(["y"]) == mgr["dense"].encode(["y"])
    assert 2 == loader.builds
    mgr.close()
