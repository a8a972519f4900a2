"""The endpoints of ``lazyenc serve``: request checks, calls into proxies, answers.

Every failure leaves as an :class:`ApiError`, rendered in the OpenAI shape
``{"error": {"message", "type", "param", "code"}}``. Calls into proxies run in a
worker thread (``run_in_threadpool``) so a long encode never blocks the event loop;
a proxy that offers an awaitable variant (``aencode``, ``arank``: the batching
proxies) is awaited instead.
"""

from __future__ import annotations

import base64
import hmac
import inspect
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._config import ServerSettings
from ._exceptions import (
    EncoderClosedError,
    EncoderLoadError,
    EncoderUnavailableError,
    InvalidInputError,
    LazyEncError,
    MemoryBudgetError,
    OverloadedError,
    RemoteError,
    UnknownEncoderError,
)
from ._manager import EncoderManager

__all__ = ["ApiError", "Context", "call", "embeddings", "method", "model", "models", "rerank", "sparse"]

log = logging.getLogger("lazyenc.server")

_DEFAULT_RETRY_AFTER_S = 1.0


class ApiError(Exception):
    """An answer other than 200, in the OpenAI error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON document sent back."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Any:
        """A starlette Response."""
        from starlette.responses import Response

        return Response(
            json.dumps(self.body()),
            status_code=self.status,
            headers=self.headers,
            media_type="application/json",
        )


def json_response(doc: Any) -> Any:
    """A compact JSON answer; non-finite floats from a model become a 500 naming them."""
    from starlette.responses import Response

    try:
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise ApiError(
            500, "the model returned NaN or infinite values", type="server_error", code="model_error"
        ) from None
    return Response(text, media_type="application/json")


@dataclass(frozen=True)
class Context:
    """What every endpoint needs: the registry, the limits and the allowed keys."""

    manager: EncoderManager
    settings: ServerSettings
    api_keys: tuple[str, ...] = ()

    def authorize(self, request: Any) -> None:
        """Raise a 401 unless keys are off or the bearer token is one of them."""
        if not self.api_keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        # Compare against every key (no early exit) so timing says nothing about which matched.
        matched = False
        for key in self.api_keys:
            matched |= hmac.compare_digest(given, key.encode())
        if not matched:
            message = "missing API key: send 'Authorization: Bearer KEY'" if not given else "invalid API key"
            raise ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


# -- request reading ---------------------------------------------------------------
async def read_json(request: Any, *, max_bytes: int) -> dict[str, Any]:
    """The JSON object of the body, refusing bodies over ``max_bytes`` before and while reading."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, f"invalid Content-Length header {declared!r}") from None
        if size > max_bytes:
            raise _too_large(size, max_bytes)
    chunks: list[bytes] = []
    received = 0
    # Counted while reading too: a chunked body has no Content-Length to check first.
    async for chunk in request.stream():
        received += len(chunk)
        if received > max_bytes:
            raise _too_large(received, max_bytes, more=True)
        chunks.append(chunk)
    try:
        doc = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(doc).__name__}", code="invalid_json")
    return doc


def _too_large(size: int, limit: int, *, more: bool = False) -> ApiError:
    at_least = "at least " if more else ""
    return ApiError(
        413,
        f"the body is {at_least}{size} bytes, over the limit of {limit} ([server] max_body_bytes)",
        code="request_too_large",
    )


def _proxy(ctx: Context, body: dict[str, Any], *, kinds: Sequence[str], endpoint: str) -> Any:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'model' is required: the name of an encoder (see GET /v1/models)", param="model")
    try:
        proxy = ctx.manager[name]
    except UnknownEncoderError as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None
    if proxy.kind not in kinds:
        raise ApiError(
            400,
            f"encoder {name!r} is of kind {proxy.kind!r}; {endpoint} serves kind {' or '.join(kinds)}",
            param="model",
            code="wrong_model_kind",
        )
    return proxy


def _texts(ctx: Context, value: Any, *, param: str = "input") -> tuple[list[str], bool]:
    """The input as a list of strings, and whether a single string was sent."""
    if isinstance(value, str):
        return [value], True
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"'{param}' must be a string or a non-empty list of strings", param=param)
    if any(isinstance(v, int) or (isinstance(v, list) and v and isinstance(v[0], int)) for v in value):
        raise ApiError(
            400,
            f"'{param}' holds token ids; this server takes text only: send strings",
            param=param,
            code="token_input_unsupported",
        )
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise ApiError(400, f"'{param}[{i}]' must be a string, got {type(v).__name__}", param=param)
    if len(value) > ctx.settings.max_inputs:
        raise ApiError(
            413,
            f"'{param}' has {len(value)} items, over the limit of {ctx.settings.max_inputs} "
            "([server] max_inputs)",
            param=param,
            code="too_many_inputs",
        )
    return value, False


def _input_type(body: dict[str, Any]) -> str:
    value = body.get("input_type")
    if value is None:
        return "encode"
    if value not in ("query", "document"):
        raise ApiError(400, f"'input_type' must be 'query' or 'document', got {value!r}", param="input_type")
    return f"encode_{value}"


def _optional_int(body: dict[str, Any], key: str, *, minimum: int = 1) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"'{key}' must be an integer >= {minimum}, got {value!r}", param=key)
    return value


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {value!r}", param=key)
    return value


# -- calling proxies -------------------------------------------------------------------
def method(proxy: Any, name: str) -> Callable[..., Any]:
    """The proxy's awaitable ``a<name>`` when it has one (batching proxies do), else ``<name>``."""
    async_fn = getattr(proxy, f"a{name}", None)
    return async_fn if inspect.iscoroutinefunction(async_fn) else getattr(proxy, name)


async def call(proxy: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``fn`` if it is async, else run it in a worker thread; map errors to answers.

    lazyenc errors become 429/503/...; the model's own errors become 500s carrying their message.
    """
    from starlette.concurrency import run_in_threadpool

    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        return await run_in_threadpool(fn, *args, **kwargs)
    except OverloadedError as exc:
        retry = proxy.settings.retry_after_s or _DEFAULT_RETRY_AFTER_S
        raise ApiError(
            429,
            str(exc),
            type="rate_limit_error",
            code="overloaded",
            headers={"Retry-After": str(max(1, math.ceil(retry)))},
        ) from None
    except InvalidInputError as exc:
        raise ApiError(400, str(exc), type="invalid_request_error", code="invalid_input") from None
    except EncoderLoadError as exc:
        raise ApiError(503, str(exc), type="service_unavailable", code="encoder_disabled") from None
    except (EncoderUnavailableError, EncoderClosedError, MemoryBudgetError) as exc:
        raise ApiError(503, str(exc), type="service_unavailable", code="encoder_unavailable") from None
    except RemoteError as exc:
        status = exc.status_code if 400 <= exc.status_code <= 599 else 502
        raise ApiError(status, str(exc), type=exc.type or "server_error", code=exc.code or None) from None
    except LazyEncError as exc:
        raise ApiError(500, str(exc), type="server_error", code="lazyenc_error") from None
    except Exception as exc:
        # The model's own failure: shown as it is, logged with its traceback.
        log.exception("encoder %s raised", proxy.name)
        raise ApiError(500, f"{type(exc).__name__}: {exc}", type="server_error", code="model_error") from None


def _count_tokens(model: Any, texts: Sequence[str], pairs_with: Sequence[str] | None = None) -> int:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:  # a model without a tokenizer (a test fake): whitespace words
        words = sum(len(t.split()) for t in texts)
        return words + (sum(len(t.split()) for t in pairs_with) if pairs_with is not None else 0)
    limit = getattr(model, "max_seq_length", None) or getattr(model, "max_length", None)
    options: dict[str, Any] = {"truncation": True, "max_length": limit} if limit else {}
    args = (list(texts),) if pairs_with is None else (list(texts), list(pairs_with))
    ids = tokenizer(*args, **options)["input_ids"]
    return sum(len(row) for row in ids)


async def count_tokens(proxy: Any, texts: Sequence[str], pairs_with: Sequence[str] | None = None) -> int:
    """Tokens the model sees (after truncation to its max length), with its own tokenizer.

    Runs through the proxy's call path: a tokenizer must not run on two threads at once.
    """
    result: int = await call(proxy, proxy._call, _count_tokens, texts, pairs_with)
    return result


# -- endpoints -------------------------------------------------------------------------
async def models(request: Any, ctx: Context) -> Any:
    """GET /v1/models: every encoder with its kind and state; loads nothing."""
    from starlette.concurrency import run_in_threadpool

    statuses = await run_in_threadpool(ctx.manager.status)  # a remote proxy's status may ask its server
    return json_response({"object": "list", "data": [_model_entry(s) for s in statuses]})


async def model(request: Any, ctx: Context) -> Any:
    """GET /v1/models/{model}: one encoder, as in the list."""
    from starlette.concurrency import run_in_threadpool

    name = request.path_params["model"]
    try:
        proxy = ctx.manager[name]
    except UnknownEncoderError as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None
    return json_response(_model_entry(await run_in_threadpool(proxy.status)))


def _model_entry(s: Any) -> dict[str, Any]:
    return {
        "id": s.name,
        "object": "model",
        "created": 0,
        "owned_by": "lazyenc",
        "kind": s.kind,
        "state": s.state,
        "reason": s.reason,
        "loaded": s.loaded,
        "dimension": s.dimension,
        "max_seq_length": s.max_seq_length,
        "device": s.device,
    }


async def embeddings(request: Any, ctx: Context) -> Any:
    """POST /v1/embeddings, as OpenAI's."""
    import numpy as np

    body = await read_json(request, max_bytes=ctx.settings.max_body_bytes)
    proxy = _proxy(ctx, body, kinds=("dense",), endpoint="/v1/embeddings")
    texts, _ = _texts(ctx, body.get("input"))
    encode = _input_type(body)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(
            400, f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", param="encoding_format"
        )
    dimensions = _optional_int(body, "dimensions")
    known = proxy.status().dimension
    if dimensions is not None and known is not None and dimensions > known:
        raise _too_many_dimensions(proxy.name, dimensions, known)

    result = await call(proxy, method(proxy, encode), texts)
    vectors = np.asarray(result, dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) != len(texts):
        raise ApiError(
            500,
            f"encoder {proxy.name!r} returned shape {vectors.shape} for {len(texts)} inputs",
            type="server_error",
            code="model_error",
        )
    if dimensions is not None:
        vectors = truncate(vectors, dimensions, name=proxy.name)
    tokens = await count_tokens(proxy, texts)
    rows: list[Any]
    if fmt == "base64":
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        rows = vectors.tolist()
    return json_response(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
            "model": proxy.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _too_many_dimensions(name: str, asked: int, has: int) -> ApiError:
    return ApiError(
        400,
        f"'dimensions' is {asked}, but encoder {name!r} makes {has}-dimensional vectors",
        param="dimensions",
    )


def truncate(vectors: Any, dimensions: int, *, name: str = "") -> Any:
    """Keep the first ``dimensions`` values; re-normalize only if the model's vectors are unit length.

    sentence-transformers' ``truncate_dim`` does not re-normalize; OpenAI's
    ``dimensions`` answers unit vectors. Re-normalizing exactly when the model
    normalizes keeps both promises: a normalizing model stays normalized, any
    other model gets the plain prefix.
    """
    import numpy as np

    if dimensions > vectors.shape[1]:
        raise _too_many_dimensions(name, dimensions, vectors.shape[1])
    norms = np.linalg.norm(vectors, axis=1)
    unit = bool(len(norms)) and bool(np.all(np.abs(norms - 1.0) < 1e-3))
    out = vectors[:, :dimensions]
    if unit:
        lengths = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.where(lengths == 0, 1.0, lengths)
    return np.ascontiguousarray(out, dtype=np.float32)


async def rerank(request: Any, ctx: Context) -> Any:
    """POST /v1/rerank, as Cohere's and Jina's."""
    body = await read_json(request, max_bytes=ctx.settings.max_body_bytes)
    proxy = _proxy(ctx, body, kinds=("rerank",), endpoint="/v1/rerank")
    query = body.get("query")
    if not isinstance(query, str):
        raise ApiError(400, "'query' must be a string", param="query")
    raw = body.get("documents")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'documents' must be a non-empty list", param="documents")
    docs: list[str] = []
    for i, d in enumerate(raw):
        text = d.get("text") if isinstance(d, dict) else d
        if not isinstance(text, str):
            raise ApiError(
                400, f"'documents[{i}]' must be a string or an object with a string 'text'", param="documents"
            )
        docs.append(text)
    _texts(ctx, docs, param="documents")  # the max_inputs limit
    top_n = _optional_int(body, "top_n")
    return_documents = _bool(body, "return_documents", False)

    ranked = await call(proxy, method(proxy, "rank"), query, docs, top_k=top_n, return_documents=False)
    tokens = await count_tokens(proxy, [query] * len(docs), docs)
    results = []
    for r in ranked:
        index = int(r["corpus_id"])
        item: dict[str, Any] = {"index": index, "relevance_score": float(r["score"])}
        if return_documents:
            item["document"] = {"text": docs[index]}
        results.append(item)
    return json_response({"model": proxy.name, "results": results, "usage": {"total_tokens": tokens}})


async def sparse(request: Any, ctx: Context) -> Any:
    """POST /v1/sparse: SPLADE vectors as (indices, values) per input, plus tokens when asked."""
    body = await read_json(request, max_bytes=ctx.settings.max_body_bytes)
    proxy = _proxy(ctx, body, kinds=("sparse",), endpoint="/v1/sparse")
    texts, _ = _texts(ctx, body.get("input"))
    encode = _input_type(body)
    return_tokens = _bool(body, "return_tokens", False)

    result = await call(proxy, method(proxy, encode), texts)
    rows = sparse_rows(result)
    if len(rows) != len(texts):
        raise ApiError(
            500,
            f"encoder {proxy.name!r} returned {len(rows)} rows for {len(texts)} inputs",
            type="server_error",
            code="model_error",
        )
    data: list[dict[str, Any]] = [
        {"index": i, "indices": indices, "values": values} for i, (indices, values) in enumerate(rows)
    ]
    if return_tokens:
        names = await call(proxy, proxy._call, _token_names, [r[0] for r in rows])
        for item, row_names in zip(data, names, strict=True):
            item["tokens"] = row_names
    tokens = await count_tokens(proxy, texts)
    return json_response(
        {
            "object": "list",
            "data": data,
            "model": proxy.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _token_names(model: Any, rows: list[list[int]]) -> list[list[str]]:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return [[str(i) for i in row] for row in rows]
    return [list(tokenizer.convert_ids_to_tokens(row)) for row in rows]


def sparse_rows(result: Any) -> list[tuple[list[int], list[float]]]:
    """(indices, values) per row of what a SparseEncoder returned, indices ascending."""
    import numpy as np

    if hasattr(result, "is_sparse") and getattr(result, "dim", lambda: 0)() == 2:
        t = result.detach().cpu()
        if t.is_sparse:
            t = t.coalesce()
            index = t.indices()
            rows_of, cols, vals = index[0].tolist(), index[1].tolist(), t.values().tolist()
            out: list[tuple[list[int], list[float]]] = [([], []) for _ in range(t.shape[0])]
            for r, c, v in sorted(zip(rows_of, cols, vals, strict=True)):
                if v:
                    out[r][0].append(c)
                    out[r][1].append(float(v))
            return out
        result = t.numpy()
    if hasattr(result, "is_sparse"):  # a list-less 1-D tensor
        result = [result]
    rows: list[tuple[list[int], list[float]]] = []
    for row in result:
        if hasattr(row, "is_sparse"):
            row = row.detach().cpu().to_dense().numpy()
        arr = np.asarray(row, dtype=np.float32).ravel()
        nz = np.flatnonzero(arr)
        rows.append((nz.tolist(), arr[nz].astype(float).tolist()))
    return rows
