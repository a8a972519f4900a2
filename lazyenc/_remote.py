"""Remote proxies: ``kind = "remote"`` encoders served by another process's ``lazyenc serve``.

A :class:`RemoteProxy` offers the methods of the server encoder's kind (encode,
encode_query, encode_document, decode, predict, rank and their ``a``-prefixed
async variants) over HTTP. It never imports torch or sentence-transformers:
dense vectors arrive as numpy arrays, sparse vectors as plain dicts.

Nothing touches the network at init. ``state``/``status()`` ask the server's
``GET /v1/models`` with a 1 s timeout and keep the answer for 2 s; an
unreachable server reads as ``unavailable`` with the reason.

Server errors arrive as lazyenc exceptions carrying the server's message:
429 -> OverloadedError, 503 -> EncoderUnavailableError (EncoderLoadError for a
disabled encoder), anything else -> RemoteError with ``status_code``. A server
that cannot be reached after the retries (connection errors only, never an
answered request) raises EncoderUnavailableError.
"""

from __future__ import annotations

import base64
import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._config import EncoderSettings, HardwareSettings
from ._exceptions import (
    EncoderLoadError,
    EncoderUnavailableError,
    LazyEncError,
    OverloadedError,
    RemoteError,
)
from ._loaders import Loader
from ._memory import Lifecycle
from ._probe import Probe, find_library
from ._proxy import ComponentStatus, EncoderProxy, State

if TYPE_CHECKING:
    import asyncio

__all__ = ["RemoteLoader", "RemoteProxy"]

STATUS_TIMEOUT_S = 1.0
STATUS_TTL_S = 2.0
_RETRY_DELAYS_S = (0.1, 0.4)  # two retries after the first attempt, on connection errors only
# Accepted for compatibility with SentenceTransformer.encode and ignored: they change nothing in the answer.
_IGNORED = frozenset({"batch_size", "show_progress_bar", "device", "convert_to_numpy"})


@dataclasses.dataclass(frozen=True)
class _Info:
    state: State
    reason: str = ""
    kind: str | None = None
    dimension: int | None = None
    max_seq_length: int | None = None


class RemoteLoader:
    """Probe for kind 'remote': checks the API key variable and httpx, never the network."""

    def __repr__(self) -> str:
        return "RemoteLoader()"

    def probe(self, settings: EncoderSettings, environ: Mapping[str, str]) -> Probe:
        missing = find_library("httpx", "remote", "httpx") or find_library("numpy", "remote", "numpy")
        if missing:
            return Probe(False, missing)
        if settings.api_key_env and not environ.get(settings.api_key_env, "").strip():
            return Probe(
                False, f"environment variable {settings.api_key_env!r} (api_key_env) is unset or empty"
            )
        return Probe(True)

    def build(self, settings: EncoderSettings, *, device: str, probe: Probe) -> Any:
        raise LazyEncError(f"encoder {settings.name!r} is remote: its model lives on {settings.url}")


def base_url(url: str) -> str:
    """The server root: 'http://h:8700', 'http://h:8700/' and 'http://h:8700/v1' are the same."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class RemoteProxy(EncoderProxy):
    """An encoder served by ``lazyenc serve`` elsewhere; same methods as the local proxy of its kind."""

    kind = "remote"

    def __init__(
        self,
        settings: EncoderSettings,
        *,
        loader: Loader | None = None,
        hardware: HardwareSettings | None = None,
        environ: Mapping[str, str] | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        super().__init__(
            settings, loader=loader or RemoteLoader(), hardware=hardware, environ=environ, lifecycle=lifecycle
        )
        self.url = base_url(settings.url or "")
        self._client: Any = None
        self._aclient: Any = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None
        self._client_lock = threading.Lock()
        self._info: _Info | None = None
        self._info_at = 0.0
        self._info_lock = threading.Lock()
        self._remote_kind: str | None = None
        self._count_lock = threading.Lock()

    # -- views (no model here; state mirrors the server) ------------------------------------
    @property
    def state(self) -> State:
        """The server encoder's state, or unavailable (with ``reason``) when it cannot be asked."""
        return self._remote_info().state

    @property
    def reason(self) -> str:
        """Why the remote encoder is unavailable or disabled; '' otherwise."""
        return self._remote_info().reason

    @property
    def loaded(self) -> bool:
        """Always False: the model is held by the server, never in this process."""
        return False

    @property
    def remote_kind(self) -> str | None:
        """The server encoder's kind (dense, sparse, rerank, ...), once known; never asks."""
        return self._remote_kind

    def peek(self) -> Any:
        """None: there is no local model."""
        return None

    def status(self) -> ComponentStatus:
        """A snapshot: the server's view of the encoder plus this proxy's call counts."""
        info = self._remote_info()
        return ComponentStatus(
            name=self.name,
            kind=self.kind,
            model=self.settings.model,
            state=info.state,
            loaded=False,
            reason=info.reason,
            device=self.url,
            dimension=info.dimension,
            max_seq_length=info.max_seq_length,
            revision=None,
            weight_bytes=None,
            load_seconds=None,
            loaded_at=None,
            last_used_at=self._last_used_at,
            calls=self._calls,
            errors=self._errors,
        )

    def __repr__(self) -> str:
        info = self._info  # the cached view only: repr never touches the network
        state = self._state if self._state == "unavailable" else (info.state if info else "unknown")
        return f"<RemoteProxy {self.name!r} -> {self.url} model={self.settings.model!r} state={state}>"

    # -- lifecycle ----------------------------------------------------------------
    def load(self) -> Any:
        """Warm the server's encoder with a one-input call; returns this proxy."""
        kind = self._kind()
        if kind in ("dense", "sparse"):
            self.encode(["warm-up"])
        elif kind == "rerank":
            self.rank("warm-up", ["warm-up"])
        else:
            raise LazyEncError(f"encoder {self.name!r}: the server's kind {kind!r} has no HTTP endpoint")
        self._info = None
        return self

    def unload(self) -> bool:
        """False: nothing is held here (unloading the server's copy is its admin's business)."""
        return False

    def reset(self) -> None:
        """Forget the cached server view and probe again."""
        with self._info_lock:
            self._info = None
            self._remote_kind = None
            self._apply_probe(self._loader.probe(self.settings, self._environ))

    def close(self) -> None:
        """Close the HTTP clients and refuse later calls."""
        self._closed = True
        with self._client_lock:
            client, self._client = self._client, None
            aclient, self._aclient = self._aclient, None
            loop, self._aclient_loop = self._aclient_loop, None
        if client is not None:
            client.close()
        if aclient is not None and loop is not None and not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(aclient.aclose())

    async def aclose(self) -> None:
        """Close the HTTP clients from inside an event loop."""
        with self._client_lock:
            aclient, self._aclient = self._aclient, None
            self._aclient_loop = None
        if aclient is not None:
            await aclient.aclose()
        self.close()

    # -- the server's view ----------------------------------------------------------
    def _remote_info(self) -> _Info:
        if self._state == "unavailable":  # the local probe failed (httpx or the key missing)
            return _Info("unavailable", self._reason)
        if self._closed:
            return _Info("unavailable", "closed")
        info = self._info
        if info is not None and time.monotonic() - self._info_at < STATUS_TTL_S:
            return info
        if info is not None:
            # Stale: answer with what we know and ask again in the background, so a
            # status surface (the admin panel's event loop) never waits on the network.
            self._refresh_in_background()
            return info
        # The first read asks the server itself; another thread already asking: wait a little.
        if not self._info_lock.acquire(timeout=STATUS_TIMEOUT_S + 0.5):
            return info or _Info("unavailable", f"waiting for the server at {self.url} to answer")
        try:
            if self._info is not None and time.monotonic() - self._info_at < STATUS_TTL_S:
                return self._info
            info = self._fetch_info(timeout=min(STATUS_TIMEOUT_S, self.settings.timeout_s))
            self._info, self._info_at = info, time.monotonic()
            return info
        finally:
            self._info_lock.release()

    def _refresh_in_background(self) -> None:
        if not self._info_lock.acquire(blocking=False):
            return  # a refresh is already under way

        def refresh() -> None:
            try:
                info = self._fetch_info(timeout=min(STATUS_TIMEOUT_S, self.settings.timeout_s))
                self._info, self._info_at = info, time.monotonic()
            finally:
                self._info_lock.release()

        threading.Thread(target=refresh, name=f"lazyenc-remote-status-{self.name}", daemon=True).start()

    def _fetch_info(self, *, timeout: float, retry: bool = False) -> _Info:
        import httpx

        delays = _RETRY_DELAYS_S if retry else ()
        for attempt in range(len(delays) + 1):
            try:
                response = self._sync_client().get("/v1/models", timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt < len(delays):
                    time.sleep(delays[attempt])
                    continue
                return _Info("unavailable", self._unreachable_reason(exc))
            except httpx.HTTPError as exc:
                return _Info("unavailable", self._unreachable_reason(exc))
            return self._info_from(response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _afetch_info(self) -> _Info:
        import asyncio

        import httpx

        for attempt in range(len(_RETRY_DELAYS_S) + 1):
            try:
                response = await self._async_client().get("/v1/models")
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt < len(_RETRY_DELAYS_S):
                    await asyncio.sleep(_RETRY_DELAYS_S[attempt])
                    continue
                return _Info("unavailable", self._unreachable_reason(exc))
            except httpx.HTTPError as exc:
                return _Info("unavailable", self._unreachable_reason(exc))
            return self._info_from(response)
        raise AssertionError("unreachable")  # pragma: no cover

    def _info_from(self, response: Any) -> _Info:
        if response.status_code != 200:
            return _Info("unavailable", f"the server at {self.url} answered: {_message(response)}")
        entries = response.json().get("data", [])
        for entry in entries:
            if entry.get("id") == self.settings.model:
                self._remote_kind = entry.get("kind")
                return _Info(
                    state=entry.get("state", "unavailable"),
                    reason=entry.get("reason", ""),
                    kind=self._remote_kind,
                    dimension=entry.get("dimension"),
                    max_seq_length=entry.get("max_seq_length"),
                )
        served = ", ".join(sorted(str(e.get("id")) for e in entries)) or "(none)"
        return _Info(
            "unavailable",
            f"the server at {self.url} has no encoder {self.settings.model!r}; it serves {served}",
        )

    def _unreachable_reason(self, exc: BaseException) -> str:
        return f"cannot reach the lazyenc server at {self.url}: {type(exc).__name__}: {exc}"

    def _kind(self) -> str:
        self._check_usable()
        if self._remote_kind is None:
            info = self._fetch_info(timeout=self.settings.timeout_s, retry=True)
            if info.kind is None:
                raise EncoderUnavailableError(self.name, info.reason)
        return self._remote_kind or ""

    async def _akind(self) -> str:
        self._check_usable()
        if self._remote_kind is None:
            info = await self._afetch_info()
            if info.kind is None:
                raise EncoderUnavailableError(self.name, info.reason)
        return self._remote_kind or ""

    # -- transport ------------------------------------------------------------------
    def _client_options(self) -> dict[str, Any]:
        from . import __version__

        headers = {"User-Agent": f"lazyenc/{__version__}"}
        if self.settings.api_key_env:
            headers["Authorization"] = f"Bearer {self._environ.get(self.settings.api_key_env, '').strip()}"
        return {"base_url": self.url, "timeout": self.settings.timeout_s, "headers": headers}

    def _sync_client(self) -> Any:
        import httpx

        with self._client_lock:
            if self._client is None:
                self._client = httpx.Client(**self._client_options())
            return self._client

    def _async_client(self) -> Any:
        import asyncio

        import httpx

        loop = asyncio.get_running_loop()
        with self._client_lock:
            # An AsyncClient's connections belong to one event loop.
            if self._aclient is None or self._aclient_loop is not loop:
                self._aclient = httpx.AsyncClient(**self._client_options())
                self._aclient_loop = loop
            return self._aclient

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        import httpx

        client = self._sync_client()
        for attempt in range(len(_RETRY_DELAYS_S) + 1):
            try:
                response = client.post(path, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == len(_RETRY_DELAYS_S):
                    raise EncoderUnavailableError(self.name, self._unreachable_reason(exc)) from exc
                time.sleep(_RETRY_DELAYS_S[attempt])
                continue
            except httpx.HTTPError as exc:
                raise RemoteError(
                    f"encoder {self.name!r}: request to {self.url}{path} failed: {type(exc).__name__}: {exc}"
                ) from exc
            return self._answer(response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _apost(self, path: str, payload: dict[str, Any]) -> Any:
        import asyncio

        import httpx

        client = self._async_client()
        for attempt in range(len(_RETRY_DELAYS_S) + 1):
            try:
                response = await client.post(path, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == len(_RETRY_DELAYS_S):
                    raise EncoderUnavailableError(self.name, self._unreachable_reason(exc)) from exc
                await asyncio.sleep(_RETRY_DELAYS_S[attempt])
                continue
            except httpx.HTTPError as exc:
                raise RemoteError(
                    f"encoder {self.name!r}: request to {self.url}{path} failed: {type(exc).__name__}: {exc}"
                ) from exc
            return self._answer(response)
        raise AssertionError("unreachable")  # pragma: no cover

    def _answer(self, response: Any) -> Any:
        if response.status_code == 200:
            return response.json()
        raise self._error(response)

    def _error(self, response: Any) -> LazyEncError:
        message = _message(response)
        status = response.status_code
        code = ""
        try:
            err = response.json().get("error") or {}
            code = str(err.get("code") or "")
            kind = str(err.get("type") or "")
        except (ValueError, AttributeError):
            kind = ""
        if status == 429:
            overloaded = OverloadedError(self.name, max_queue=0)
            overloaded.args = (f"the server at {self.url}: {message}",)
            overloaded.retry_after_s = _retry_after(response)  # type: ignore[attr-defined]
            return overloaded
        if status == 503:
            cls = EncoderLoadError if code == "encoder_disabled" else EncoderUnavailableError
            return cls(self.name, f"the server at {self.url}: {message}")
        return RemoteError(
            f"encoder {self.name!r}: the server at {self.url} answered {status}: {message}",
            status_code=status,
            type=kind,
            code=code,
        )

    def _counted(self) -> _Counter:
        return _Counter(self)

    # -- dense and sparse ------------------------------------------------------------------
    def encode(self, inputs: str | Sequence[str], **kwargs: Any) -> Any:
        """SentenceTransformer.encode (numpy arrays) or, for sparse, one dict per input."""
        return self._encode(inputs, None, kwargs)

    def encode_query(self, inputs: str | Sequence[str], **kwargs: Any) -> Any:
        """encode with the model's query prompt."""
        return self._encode(inputs, "query", kwargs)

    def encode_document(self, inputs: str | Sequence[str], **kwargs: Any) -> Any:
        """encode with the model's document prompt."""
        return self._encode(inputs, "document", kwargs)

    async def aencode(self, inputs: str | Sequence[str], **kwargs: Any) -> Any:
        """encode, awaitable."""
        return await self._aencode(inputs, None, kwargs)

    async def aencode_query(self, inputs: str | Sequence[str], **kwargs: Any) -> Any:
        """encode_query, awaitable."""
        return await self._aencode(inputs, "query", kwargs)

    async def aencode_document(self, inputs: str | Sequence[str], **kwargs: Any) -> Any:
        """encode_document, awaitable."""
        return await self._aencode(inputs, "document", kwargs)

    def _encode(self, inputs: Any, input_type: str | None, kwargs: dict[str, Any]) -> Any:
        texts, single = _texts(inputs)
        options = _encode_options(kwargs)
        with self._counted():
            kind = self._kind()
            path, payload = self._encode_request(kind, texts, input_type)
            return _encode_result(kind, self._post(path, payload), single, options)

    async def _aencode(self, inputs: Any, input_type: str | None, kwargs: dict[str, Any]) -> Any:
        texts, single = _texts(inputs)
        options = _encode_options(kwargs)
        with self._counted():
            kind = await self._akind()
            path, payload = self._encode_request(kind, texts, input_type)
            return _encode_result(kind, await self._apost(path, payload), single, options)

    def _encode_request(
        self, kind: str, texts: list[str], input_type: str | None
    ) -> tuple[str, dict[str, Any]]:
        payload: dict[str, Any] = {"model": self.settings.model, "input": texts}
        if input_type:
            payload["input_type"] = input_type
        if kind == "dense":
            return "/v1/embeddings", {**payload, "encoding_format": "base64"}
        if kind == "sparse":
            return "/v1/sparse", {**payload, "return_tokens": True}
        raise LazyEncError(
            f"encoder {self.name!r} is a remote {kind!r} encoder: encode needs dense or sparse"
        )

    def decode(self, embedding: Any, top_k: int | None = None) -> Any:
        """SparseEncoder.decode over what this proxy's encode returned: (token, weight), heaviest first.

        Works locally (encode already brought the tokens); a list of rows gives a list of lists.
        """
        if isinstance(embedding, Mapping):
            return _decode_row(embedding, top_k)
        if isinstance(embedding, list | tuple):
            return [_decode_row(row, top_k) for row in embedding]
        raise TypeError(
            "a remote sparse proxy decodes what its encode returned: a dict with 'indices', "
            f"'values' and 'tokens' (or a list of them), not {type(embedding).__name__}"
        )

    # -- rerank ------------------------------------------------------------------------
    def rank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        return_documents: bool = False,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """CrossEncoder.rank: ``[{"corpus_id", "score"[, "text"]}]``, best first."""
        _check_kwargs(kwargs, "rank")
        docs = list(documents)
        with self._counted():
            body = self._post("/v1/rerank", self._rank_payload(query, docs, top_k))
        return _rank_result(body, docs, return_documents)

    async def arank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        return_documents: bool = False,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """rank, awaitable."""
        _check_kwargs(kwargs, "rank")
        docs = list(documents)
        with self._counted():
            body = await self._apost("/v1/rerank", self._rank_payload(query, docs, top_k))
        return _rank_result(body, docs, return_documents)

    def _rank_payload(self, query: str, docs: list[str], top_k: int | None) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.settings.model, "query": query, "documents": docs}
        if top_k is not None:
            payload["top_n"] = top_k
        return payload

    def predict(self, sentences: Any, **kwargs: Any) -> Any:
        """CrossEncoder.predict: a numpy array of scores (a scalar for one pair).

        Sent as one /v1/rerank request per distinct query.
        """
        _check_kwargs(kwargs, "predict")
        pairs, single = _pairs(sentences)
        groups = _group_by_query(pairs)
        with self._counted():
            answers = [
                self._post("/v1/rerank", self._rank_payload(q, [pairs[i][1] for i in idx], None))
                for q, idx in groups.items()
            ]
        return _predict_result(len(pairs), groups, answers, single)

    async def apredict(self, sentences: Any, **kwargs: Any) -> Any:
        """predict, awaitable; the per-query requests run concurrently."""
        import asyncio

        _check_kwargs(kwargs, "predict")
        pairs, single = _pairs(sentences)
        groups = _group_by_query(pairs)
        with self._counted():
            answers = await asyncio.gather(
                *(
                    self._apost("/v1/rerank", self._rank_payload(q, [pairs[i][1] for i in idx], None))
                    for q, idx in groups.items()
                )
            )
        return _predict_result(len(pairs), groups, list(answers), single)


class _Counter:
    """Counts a call and its failure on the proxy's status counters."""

    def __init__(self, proxy: RemoteProxy) -> None:
        self.proxy = proxy

    def __enter__(self) -> None:
        with self.proxy._count_lock:
            self.proxy._calls += 1

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        with self.proxy._count_lock:
            if exc_type is not None:
                self.proxy._errors += 1
            self.proxy._last_used_at = time.time()


# -- wire helpers -----------------------------------------------------------------
def _message(response: Any) -> str:
    try:
        err = response.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return f"HTTP {response.status_code}: {response.text[:200]}"


def _retry_after(response: Any) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _texts(inputs: Any) -> tuple[list[str], bool]:
    if isinstance(inputs, str):
        return [inputs], True
    texts = list(inputs)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"a remote encoder takes strings; item {i} is {type(t).__name__}")
    return texts, False


def _check_kwargs(kwargs: dict[str, Any], method: str) -> None:
    unknown = sorted(set(kwargs) - _IGNORED)
    if unknown:
        raise TypeError(f"a remote {method} does not support {', '.join(unknown)} (not sent over HTTP)")


def _encode_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        k: kwargs.pop(k) for k in ("truncate_dim", "normalize_embeddings") if k in kwargs
    }
    if kwargs.get("convert_to_numpy") is False:
        raise TypeError("a remote encode returns numpy arrays only (convert_to_numpy=False needs torch)")
    for key, allowed in (("convert_to_tensor", False), ("precision", "float32")):
        if key in kwargs:
            if kwargs.pop(key) != allowed:
                raise TypeError(f"a remote encode supports only {key}={allowed!r}")
    _check_kwargs(kwargs, "encode")
    return options


def _encode_result(kind: str, body: Any, single: bool, options: dict[str, Any]) -> Any:
    import numpy as np

    rows = sorted(body["data"], key=lambda d: d["index"])
    if kind == "sparse":
        sparse = [
            {"indices": r["indices"], "values": r["values"], "tokens": r.get("tokens", [])} for r in rows
        ]
        return sparse[0] if single else sparse
    vectors = np.stack([np.frombuffer(base64.b64decode(r["embedding"]), dtype="<f4") for r in rows]).astype(
        np.float32
    )
    if options.get("truncate_dim"):
        vectors = vectors[:, : options["truncate_dim"]]  # as sentence-transformers: no re-normalizing
    if options.get("normalize_embeddings"):
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return vectors[0] if single else vectors


def _decode_row(row: Any, top_k: int | None) -> list[tuple[str, float]]:
    if not isinstance(row, Mapping) or "values" not in row or "tokens" not in row:
        raise TypeError(
            "decode needs the dicts a remote sparse encode returned ('indices', 'values', 'tokens')"
        )
    pairs = sorted(zip(row["tokens"], row["values"], strict=True), key=lambda p: -p[1])
    return [(str(t), float(v)) for t, v in (pairs[:top_k] if top_k is not None else pairs)]


def _rank_result(body: Any, docs: list[str], return_documents: bool) -> list[dict[str, Any]]:
    out = []
    for r in body["results"]:
        item: dict[str, Any] = {"corpus_id": r["index"], "score": float(r["relevance_score"])}
        if return_documents:
            item["text"] = docs[r["index"]]
        out.append(item)
    return out


def _pairs(sentences: Any) -> tuple[list[tuple[str, str]], bool]:
    single = isinstance(sentences, list | tuple) and len(sentences) == 2 and isinstance(sentences[0], str)
    items = [sentences] if single else list(sentences)
    pairs = []
    for i, p in enumerate(items):
        if not (isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(x, str) for x in p)):
            raise TypeError(f"predict takes (query, document) string pairs; item {i} is {p!r:.80}")
        pairs.append((p[0], p[1]))
    return pairs, single


def _group_by_query(pairs: list[tuple[str, str]]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, (query, _) in enumerate(pairs):
        groups.setdefault(query, []).append(i)
    return groups


def _predict_result(n: int, groups: dict[str, list[int]], answers: list[Any], single: bool) -> Any:
    import numpy as np

    scores = np.zeros(n, dtype=np.float32)
    for idx, body in zip(groups.values(), answers, strict=True):
        for r in body["results"]:
            scores[idx[r["index"]]] = r["relevance_score"]
    return scores[0] if single else scores
