"""Parallel lanes (batch.parallel): a coalesced batch cut in parts that run at once,
the first on the model, the others on copies that share its weights.

A copyable fake shows what real models cannot show deterministically (which
thread ran which texts, that the parts overlap, a failure in one part); the
real packaged models show that split batches give one-at-a-time results and
that the lanes' torch threads leave the rest of the process alone."""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lazyenc import BatchSettings, EncoderManager, _batching, load_config
from lazyenc._lanes import auto_parallel, replicate
from lazyenc.testing import FakeLoader, FakeModel, make_settings
from tests._polling import wait_for

TEXTS = [" ".join(["word"] * n) for n in range(1, 17)]  # 16 texts of 1 to 16 words


class LaneModel:
    """A fake whose copies share its record: each call notes (thread, original?, texts, batch_size).

    ``gate`` holds the call holding the text "blocker"; ``barrier`` makes calls of
    several texts wait for each other (a deadlock, broken after 30 s, if the
    parts did not run at once); ``fail_on`` raises ``error`` for a call holding it.
    """

    def __init__(
        self,
        record: list[tuple[str, bool, list[str], int | None]],
        *,
        gate: threading.Event | None = None,
        barrier: threading.Barrier | None = None,
        fail_on: str | None = None,
        error: BaseException | None = None,
        original: bool = True,
        copies: list[weakref.ref[LaneModel]] | None = None,
    ) -> None:
        self.record = record
        self.copies: list[weakref.ref[LaneModel]] = [] if copies is None else copies
        self.gate, self.barrier = gate, barrier
        self.fail_on, self.error = fail_on, error
        self.original = original

    def __deepcopy__(self, memo: dict[int, Any]) -> LaneModel:
        twin = LaneModel(
            self.record,
            gate=self.gate,
            barrier=self.barrier,
            fail_on=self.fail_on,
            error=self.error,
            original=False,
            copies=self.copies,
        )
        self.copies.append(weakref.ref(twin))
        return twin

    def encode(self, inputs: Any, **kwargs: Any) -> Any:
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        self.record.append((threading.current_thread().name, self.original, texts, kwargs.get("batch_size")))
        if self.gate is not None and "blocker" in texts:
            self.gate.wait()
        if self.barrier is not None and len(texts) > 1:
            self.barrier.wait(timeout=30)
        if self.error is not None and self.fail_on in texts:
            raise self.error
        return FakeModel().encode(inputs)


def lane_manager(model: Any, **batch: Any) -> EncoderManager:
    settings = make_settings({"enc": "dense"})
    enc = settings.encoders[0].replace(batch=BatchSettings(**batch))
    return EncoderManager(
        settings.replace(encoders=(enc,)), loaders={"enc": FakeLoader(model_factory=lambda: model)}
    )


def queue_behind_a_blocked_worker(
    proxy: Any, inputs: list[Any], call: Callable[[Any], Any], release: Callable[[], None]
) -> list[Any]:
    """Hold the worker in a first call, queue one request per input, release; each caller's outcome."""
    outcomes: list[Any] = [None] * len(inputs)

    def run(i: int) -> None:
        try:
            outcomes[i] = call(inputs[i])
        except BaseException as exc:
            outcomes[i] = exc

    blocker = threading.Thread(target=lambda: call("blocker"))
    blocker.start()
    assert wait_for(lambda: proxy._batcher._batch_running and proxy._batcher.queue_depth == 0)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: proxy._batcher.queue_depth == len(inputs))
    release()
    for thread in [blocker, *threads]:
        thread.join()
    return outcomes


def lane_threads(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"lazyenc-lane-{name}")]


@pytest.fixture
def split_run() -> Iterator[tuple[EncoderManager, list[Any], list[Any]]]:
    """16 requests of 1 to 16 words, queued together behind a blocked call, with parallel = 2."""
    record: list[Any] = []
    gate = threading.Event()
    model = LaneModel(record, gate=gate, barrier=threading.Barrier(2))
    with lane_manager(model, parallel=2) as mgr:
        proxy = mgr["enc"]
        proxy.load()
        outcomes = queue_behind_a_blocked_worker(proxy, TEXTS, proxy.encode, gate.set)
        yield mgr, record, outcomes


def test_a_large_batch_runs_as_two_parts_at_once_on_the_model_and_its_copy(
    split_run: tuple[EncoderManager, list[Any], list[Any]],
) -> None:
    """16 queued texts run as a long part and a short part, at once, on two lane threads."""
    mgr, record, outcomes = split_run
    assert [FakeModel().encode(text) for text in TEXTS] == outcomes
    parts = record[1:]  # after the blocker
    assert 2 == len(parts)
    assert 2 == len({thread for thread, *_ in parts})
    assert all(thread.startswith("lazyenc-lane-enc") for thread, *_ in parts)
    assert {True, False} == {original for _, original, *_ in parts}  # the model and one copy
    long_part, short_part = sorted(parts, key=lambda part: -len(part[2][0]))
    assert min(map(len, long_part[2])) >= max(map(len, short_part[2]))
    assert sorted(TEXTS) == sorted(long_part[2] + short_part[2])
    status = mgr["enc"].status()
    assert (1, 2, 17) == (mgr["enc"]._batcher.batches_split, status.batches_run, status.calls)


def test_unload_ends_the_lane_threads_and_drops_the_copies(
    split_run: tuple[EncoderManager, list[Any], list[Any]],
) -> None:
    """After a split batch, unload() leaves no lane thread and no copy of the model."""
    mgr, _, _ = split_run
    proxy = mgr["enc"]
    copy = weakref.ref(proxy._batcher._replicas[0])
    assert 2 == len(lane_threads("enc"))
    assert proxy.unload()
    gc.collect()
    assert ([], None) == (lane_threads("enc"), copy())


def test_an_idle_unload_drops_the_copies_with_the_model() -> None:
    """The idle reaper's unload drops the copies at once, so that their shared weights are freed."""
    gate = threading.Event()
    model = LaneModel([], gate=gate)
    settings = make_settings({"enc": "dense"}, idle_unload_s=0.05)
    enc = settings.encoders[0].replace(batch=BatchSettings(parallel=2))
    loader = FakeLoader(model_factory=lambda: model)
    with EncoderManager(settings.replace(encoders=(enc,)), loaders={"enc": loader}) as mgr:
        proxy = mgr["enc"]
        proxy.load()
        queue_behind_a_blocked_worker(proxy, TEXTS, proxy.encode, gate.set)
        assert 1 == proxy._batcher.batches_split
        assert wait_for(lambda: proxy.state == "idle")
        assert [None] == [copy() for copy in model.copies]
        assert wait_for(lambda: not lane_threads("enc"))


def test_a_batch_under_twelve_texts_runs_whole_on_the_worker() -> None:
    """Parts of a few texts would each pay a whole forward pass: small batches do not split."""
    record: list[Any] = []
    gate = threading.Event()
    with lane_manager(LaneModel(record, gate=gate), parallel=2) as mgr:
        proxy = mgr["enc"]
        proxy.load()
        queue_behind_a_blocked_worker(proxy, TEXTS[:11], proxy.encode, gate.set)
        assert [("lazyenc-batch-enc", True)] == [(thread, original) for thread, original, *_ in record[1:]]
        assert 0 == proxy._batcher.batches_split


def test_auto_keeps_batches_of_a_model_that_is_not_a_torch_module_whole() -> None:
    """parallel = "auto" (the default) only splits for torch models on a CPU."""
    record: list[Any] = []
    gate = threading.Event()
    with lane_manager(LaneModel(record, gate=gate)) as mgr:
        proxy = mgr["enc"]
        proxy.load()
        queue_behind_a_blocked_worker(proxy, TEXTS, proxy.encode, gate.set)
        assert 2 == len(record)
        assert 0 == proxy._batcher.batches_split
    assert 1 == auto_parallel(FakeModel(), "cpu")


def test_a_failure_in_one_part_reaches_its_own_callers_unchanged() -> None:
    """The model's exception in the long part goes, as the same object, to that part's callers only."""
    record: list[Any] = []
    gate = threading.Event()
    error = RuntimeError("forward failed")
    model = LaneModel(record, gate=gate, fail_on=TEXTS[-1], error=error)
    with lane_manager(model, parallel=2) as mgr:
        proxy = mgr["enc"]
        proxy.load()
        outcomes = queue_behind_a_blocked_worker(proxy, TEXTS, proxy.encode, gate.set)
        failed_part = next(texts for _, _, texts, _ in record[1:] if TEXTS[-1] in texts)
        for text, outcome in zip(TEXTS, outcomes, strict=True):
            if text in failed_part:
                assert outcome is error
            else:
                assert FakeModel().encode(text) == outcome
        assert sum(outcome is error for outcome in outcomes) == len(failed_part) < len(TEXTS)
        assert (17, len(failed_part)) == (proxy.status().calls, proxy.status().errors)
        assert FakeModel().encode("still serving") == proxy.encode("still serving")


def test_a_model_that_cannot_be_copied_runs_its_batches_whole_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """FakeModel holds an Event, which deepcopy refuses: a warning names the encoder, batches run whole."""
    gate = threading.Event()
    model = FakeModel(gate=gate)
    with lane_manager(model, parallel=2) as mgr, caplog.at_level(logging.WARNING, logger="lazyenc"):
        proxy = mgr["enc"]
        proxy.load()
        outcomes = queue_behind_a_blocked_worker(proxy, TEXTS, proxy.encode, gate.set)
        assert [FakeModel().encode(text) for text in TEXTS] == outcomes
        assert 0 == proxy._batcher.batches_split
        assert 2 == model.calls
    assert any(
        "encoder 'enc'" in r.getMessage() and "batch.parallel = 2" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize(
    ("lengths", "parts", "cuts", "sizes"),
    [
        # Four long texts against twelve short: the long ones alone cost about what the short ones do.
        ([[100]] * 4 + [[10]] * 12, 2, [4], [4, 12]),
        ([[50]] * 16, 2, [8], [8, 8]),
        # A request of several texts stays whole; its texts count in its part's cost.
        ([[90, 90, 90], [80], [10], [10], [10]], 2, [1], [3, 4]),
        # Three parts: equal shares of characters plus the per-text cost.
        ([[10]] * 9, 3, [3, 6], [3, 3, 3]),
        ([[10]] * 2, 3, [1], [1, 1]),
    ],
)
def test_split_gives_parts_of_about_equal_cost(
    lengths: list[list[int]], parts: int, cuts: list[int], sizes: list[int]
) -> None:
    """Requests sorted longest first are cut where the slower part is cheapest."""
    assert (cuts, sizes) == _batching.split(lengths, parts=parts, overhead=180, per_text=11, largest=64)


# -- the real packaged models ---------------------------------------------------------------
CONFIG = Path(__file__).resolve().parent.parent / "config.example.toml"
CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "dense": lambda proxy, text: proxy.encode(text),
    "sparse": lambda proxy, text: proxy.encode(text),
    "rerank": lambda proxy, text: proxy.predict(("which words repeat?", text)),
}


@pytest.fixture(scope="module")
def real() -> Iterator[EncoderManager]:
    """config.example.toml with parallel = 2 (not "auto"): lanes whatever this machine's cores."""
    settings = load_config(CONFIG)
    encoders = tuple(
        enc.replace(batch=enc.batch.replace(parallel=2)) if enc.name in CALLS else enc
        for enc in settings.encoders
    )
    with EncoderManager(settings.replace(encoders=encoders)) as mgr:
        yield mgr


def dense_of(value: Any) -> np.ndarray:
    import torch

    if isinstance(value, torch.Tensor):
        return (value.to_dense() if value.is_sparse else value).numpy()
    return np.asarray(value)


def split_on_real_model(proxy: Any, name: str) -> list[Any]:
    """16 single-text calls queued together behind a held call lock: one split batch."""
    before = proxy._batcher.batches_split
    lock = proxy._call_lock
    lock.acquire()
    outcomes = queue_behind_a_blocked_worker(
        proxy, TEXTS, lambda text: CALLS[name](proxy, text), lock.release
    )
    assert before + 1 == proxy._batcher.batches_split
    return outcomes


@pytest.mark.real
@pytest.mark.parametrize("name", ["dense", "sparse", "rerank"])
def test_split_batches_of_real_models_give_one_at_a_time_results(real: EncoderManager, name: str) -> None:
    """A batch run as two parts on the model and its copy equals calling the model on each text alone."""
    proxy = real[name]
    model = proxy.load()
    alone = [CALLS[name](model, text) for text in TEXTS]
    outcomes = split_on_real_model(proxy, name)
    assert [type(a) for a in alone] == [type(o) for o in outcomes]
    assert all(np.abs(dense_of(a) - dense_of(o)).max() <= 1e-5 for a, o in zip(alone, outcomes, strict=True))


@pytest.mark.real
def test_auto_splits_dense_batches_and_keeps_sparse_ones_whole() -> None:
    """With config.example.toml's "auto", dense splits a 16-text batch; memory-bound sparse does not."""
    import torch

    with EncoderManager.from_toml(CONFIG) as mgr:
        for name, splits in (("dense", int(torch.get_num_threads() >= 2)), ("sparse", 0)):
            proxy = mgr[name]
            proxy.load()
            lock = proxy._call_lock
            lock.acquire()
            queue_behind_a_blocked_worker(proxy, TEXTS, lambda text, p=proxy: p.encode(text), lock.release)
            assert (name, splits) == (name, proxy._batcher.batches_split)


@pytest.mark.real
def test_lanes_run_torch_on_their_share_of_threads_and_leave_the_process_default(
    real: EncoderManager,
) -> None:
    """Each lane thread gets half of torch's threads; the caller's and new threads' counts are unchanged."""
    import torch

    proxy = real["dense"]
    proxy.load()
    threads = torch.get_num_threads()
    split_on_real_model(proxy, "dense")
    lanes = proxy._batcher._lanes
    assert [max(1, threads // 2)] * 2 == [lanes.submit(torch.get_num_threads).result() for _ in range(2)]
    fresh: list[int] = []
    thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert [threads, threads] == [torch.get_num_threads(), *fresh]


@pytest.mark.real
def test_a_copy_of_a_real_model_shares_its_weights_but_not_its_tokenizer(real: EncoderManager) -> None:
    """replicate() copies modules and tokenizer (not re-entrant), not the tensors."""
    model = real["dense"].load()
    twin = replicate(model)
    assert all(
        a.data_ptr() == b.data_ptr() for a, b in zip(model.parameters(), twin.parameters(), strict=True)
    )
    assert model.tokenizer is not twin.tokenizer
    import torch

    assert (2 if torch.get_num_threads() >= 2 else 1) == auto_parallel(model, "cpu")
    assert 1 == auto_parallel(model, "cuda:0")


@pytest.mark.real
def test_unload_after_a_split_batch_leaves_neither_the_model_nor_its_copy(real: EncoderManager) -> None:
    """Nothing keeps the model's weights alive once unload() returns: not the lanes, not the copy."""
    proxy = real["dense"]
    model = weakref.ref(proxy.load())
    split_on_real_model(proxy, "dense")
    copy = weakref.ref(proxy._batcher._replicas[0])
    assert proxy.unload()
    assert (None, None, []) == (model(), copy(), lane_threads("dense"))
