"""Batching on the real packaged models (config.example.toml): concurrent callers
get what one-at-a-time calls give, within 1e-5, in order, with the same types.

The rerank model is MiniLM with an untrained scoring head: its scores mean
nothing, but batched and single calls must still agree."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lazyenc import EncoderManager, InvalidInputError

pytestmark = pytest.mark.real

CONFIG = Path(__file__).resolve().parent.parent / "config.example.toml"
TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "hello",
    "",
    "a considerably longer sentence, with commas, numbers like 42 and 1984, and many more words to pad",
    "Ünïcödé wörds ça marche",
    "short one",
    "embeddings of texts of very different lengths share one padded batch",
    "x",
]


@pytest.fixture(scope="module")
def manager() -> Iterator[EncoderManager]:
    with EncoderManager.from_toml(CONFIG) as mgr:
        yield mgr


def as_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return (value.to_dense() if value.is_sparse else value).cpu().numpy()
    return np.asarray(value)


def max_diff(expected: Any, actual: Any) -> float:
    e, a = as_array(expected), as_array(actual)
    assert e.shape == a.shape
    return float(np.abs(e - a).max()) if e.size else 0.0


def inputs_for(i: int) -> Any:
    """Caller i's input: a string for even callers, a short list for odd ones."""
    if i % 2 == 0:
        return TEXTS[i % len(TEXTS)]
    return [TEXTS[(i + k) % len(TEXTS)] for k in range(1 + i % 3)]


def run_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def target(i: int) -> None:
        start.wait()
        try:
            results[i] = fn(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [] == errors
    return results


@pytest.mark.parametrize("name", ["dense", "sparse"])
def test_sixteen_threads_get_the_rows_of_one_at_a_time_calls(manager: EncoderManager, name: str) -> None:
    """16 threads encoding at once each get exactly what calling the model alone gives."""
    proxy = manager[name]
    model = proxy.load()
    expected = [model.encode(inputs_for(i)) for i in range(16)]
    before = proxy.status().batches_run
    results = run_threads(16, lambda i: proxy.encode(inputs_for(i)))
    assert [type(e) for e in expected] == [type(r) for r in results]
    assert all(max_diff(e, r) <= 1e-5 for e, r in zip(expected, results, strict=True))
    assert proxy.status().batches_run > before


@pytest.mark.parametrize("name", ["dense", "sparse"])
async def test_sixty_four_tasks_get_the_rows_of_one_at_a_time_calls(
    manager: EncoderManager, name: str
) -> None:
    """64 coroutines encoding at once share batches and each get their own rows, in order."""
    proxy = manager[name]
    model = proxy.load()
    expected = [model.encode(inputs_for(i)) for i in range(64)]
    before = proxy.status()
    results = await asyncio.gather(*(proxy.aencode(inputs_for(i)) for i in range(64)))
    after = proxy.status()
    assert all(max_diff(e, r) <= 1e-5 for e, r in zip(expected, results, strict=True))
    assert after.batches_run - before.batches_run < 64


def pairs_for(i: int) -> Any:
    if i % 2 == 0:
        return ("what is a fox?", TEXTS[i % len(TEXTS)])
    return [(TEXTS[i % len(TEXTS)], TEXTS[(i + k) % len(TEXTS)]) for k in range(1 + i % 3)]


def test_sixteen_threads_predict_and_rank_like_one_at_a_time_calls(manager: EncoderManager) -> None:
    """Concurrent predict and rank calls on the cross-encoder agree with lone calls."""
    proxy = manager["rerank"]
    model = proxy.load()
    expected = [
        model.predict(pairs_for(i)) if i % 4 else model.rank(TEXTS[i % 8], TEXTS, return_documents=i % 8 == 0)
        for i in range(16)
    ]
    results = run_threads(
        16,
        lambda i: (
            proxy.predict(pairs_for(i))
            if i % 4
            else proxy.rank(TEXTS[i % 8], TEXTS, return_documents=i % 8 == 0)
        ),
    )
    for i, (e, r) in enumerate(zip(expected, results, strict=True)):
        if i % 4:
            assert type(e) is type(r)
            assert max_diff(e, r) <= 1e-5
        else:
            assert [d["corpus_id"] for d in e] == [d["corpus_id"] for d in r]
            assert [d.get("text") for d in e] == [d.get("text") for d in r]
            assert max_diff([d["score"] for d in e], [d["score"] for d in r]) <= 1e-5


async def test_sixty_four_tasks_predict_and_rank_like_one_at_a_time_calls(manager: EncoderManager) -> None:
    """apredict and arank from 64 tasks agree with lone calls and keep rank's shape."""
    proxy = manager["rerank"]
    model = proxy.load()
    expected = [model.predict(pairs_for(i)) for i in range(64)]
    ranked = model.rank("fox", TEXTS, top_k=3, return_documents=True)
    results = await asyncio.gather(*(proxy.apredict(pairs_for(i)) for i in range(64)))
    assert all(max_diff(e, r) <= 1e-5 for e, r in zip(expected, results, strict=True))
    got = await proxy.arank("fox", TEXTS, top_k=3, return_documents=True)
    assert [(d["corpus_id"], d["text"]) for d in ranked] == [(d["corpus_id"], d["text"]) for d in got]


def test_batched_results_keep_sentence_transformers_types(manager: EncoderManager) -> None:
    """A str gives one row, a list a 2-D result, with the layout and dtype of a direct call."""
    dense, sparse, rerank = manager["dense"], manager["sparse"], manager["rerank"]
    assert (np.ndarray, (384,)) == (type(dense.encode("hi")), dense.encode("hi").shape)
    assert (np.ndarray, (2, 384)) == (type(dense.encode(["a", "b"])), dense.encode(["a", "b"]).shape)
    tensor = dense.encode(["a", "b"], convert_to_tensor=True)
    assert (torch.Tensor, (2, 384)) == (type(tensor), tuple(tensor.shape))
    one = sparse.encode("the quick brown fox")
    many = sparse.encode(["the quick brown fox", "hello"])
    assert (torch.sparse_coo, (30522,)) == (one.layout, tuple(one.shape))
    assert (torch.sparse_coo, (2, 30522)) == (many.layout, tuple(many.shape))
    assert ["brown", "quick", "fox"] == [token for token, _ in sparse.decode(one, top_k=3)]
    assert type(rerank.predict(("q", "d"))) is np.float32
    assert (np.ndarray, (2,)) == (
        type(rerank.predict([("q", "d"), ("q", "e")])),
        rerank.predict([("q", "d")] * 2).shape,
    )


OPTIONS: list[dict[str, Any]] = [
    {},
    {"normalize_embeddings": True},
    {"truncate_dim": 64},
    {"convert_to_tensor": True},
    {"prompt": "query: "},
    {"normalize_embeddings": True, "truncate_dim": 32},
    {"output_value": "token_embeddings"},
    {"convert_to_numpy": False},
]


def test_concurrent_calls_with_different_options_each_get_their_own_options(manager: EncoderManager) -> None:
    """Options that change the output never leak between callers that share the queue."""
    proxy = manager["dense"]
    model = proxy.load()
    calls = [(TEXTS[i % 8] if i % 3 else TEXTS[:3], OPTIONS[i % len(OPTIONS)]) for i in range(16)]
    expected = [model.encode(inputs, **options) for inputs, options in calls]
    results = run_threads(16, lambda i: proxy.encode(calls[i][0], **calls[i][1]))
    for e, r in zip(expected, results, strict=True):
        assert type(e) is type(r)
        if isinstance(e, list):
            assert len(e) == len(r)
            assert all(max_diff(a, b) <= 1e-5 for a, b in zip(e, r, strict=True))
        else:
            assert max_diff(e, r) <= 1e-5


def test_one_bad_input_among_concurrent_calls_fails_alone(manager: EncoderManager) -> None:
    """A list with a non-string fails its own caller with InvalidInputError; the others succeed."""
    proxy = manager["dense"]
    model = proxy.load()
    expected = [model.encode(TEXTS[i % 8]) for i in range(16)]

    def call(i: int) -> Any:
        if i == 5:
            try:
                proxy.encode(["fine", None])
            except InvalidInputError as exc:
                return exc
        return proxy.encode(TEXTS[i % 8])

    results = run_threads(16, call)
    assert "encoder 'dense': inputs[1] must be a str, got NoneType None" == str(results[5])
    assert all(max_diff(expected[i], results[i]) <= 1e-5 for i in range(16) if i != 5)


async def test_async_query_and_document_encodings_match_direct_calls(manager: EncoderManager) -> None:
    """aencode_query and aencode_document give encode_query and encode_document's rows."""
    for name in ("dense", "sparse"):
        proxy = manager[name]
        model = proxy.load()
        query, document = await asyncio.gather(
            proxy.aencode_query("a fox"), proxy.aencode_document(["a doc"])
        )
        assert max_diff(model.encode_query("a fox"), query) <= 1e-5
        assert max_diff(model.encode_document(["a doc"]), document) <= 1e-5


async def test_spacy_runs_its_async_calls_in_a_thread(manager: EncoderManager) -> None:
    """apipe and acall give the same docs as pipe and __call__ (spaCy is not batched)."""
    nlp = manager["spacy"]
    docs = await nlp.apipe(["The fox jumps.", "Berlin is big."])
    doc = await nlp.acall("Apple buys a startup.")
    assert [[t.text for t in d] for d in nlp.pipe(["The fox jumps.", "Berlin is big."])] == [
        [t.text for t in d] for d in docs
    ]
    assert [t.text for t in nlp("Apple buys a startup.")] == [t.text for t in doc]
    assert nlp._batcher is None


def test_status_shows_batching_and_unload_stops_the_worker(manager: EncoderManager) -> None:
    """After concurrent calls the status counts batches; unload ends the worker thread."""
    proxy = manager["dense"]
    run_threads(8, lambda i: proxy.encode(TEXTS[i]))
    status = proxy.status()
    assert status.batches_run > 0
    assert status.mean_batch_size is not None and status.mean_batch_size >= 1
    assert 0 == status.queue_depth
    assert "lazyenc-batch-dense" in [t.name for t in threading.enumerate()]
    assert manager.unload("dense") is True
    assert "lazyenc-batch-dense" not in [t.name for t in threading.enumerate()]
    assert (384,) == proxy.encode("built again").shape
