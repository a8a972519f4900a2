"""The server app on lazyenc.testing fakes: overload, model failures, shutdown, validation."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import lazyenc
from lazyenc.server import api_keys, create_app
from lazyenc.testing import FakeLoader, FakeModel, make_settings
from tests._server_helpers import ThreadServer


def manager_with(models: dict[str, FakeModel], *, kinds: dict[str, str] | None = None, **server: Any) -> Any:
    """A manager whose encoders are the given fake models (dense unless ``kinds`` says otherwise)."""
    kinds = kinds or {}
    settings = make_settings({name: kinds.get(name, "dense") for name in models})
    settings = settings.replace(
        encoders=tuple(e.replace(retry_after_s=3.0) for e in settings.encoders),
        server=settings.server.replace(**server),
    )
    loaders = {name: FakeLoader(model_factory=lambda m=model: m) for name, model in models.items()}
    return lazyenc.EncoderManager(settings, loaders=loaders)


def error_of(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    assert {"message", "type", "param", "code"} == set(body)
    return body


def test_extra_routes_are_mounted_beside_the_api() -> None:
    """Routes passed as extra_routes (the admin panel's, at merge) answer next to /v1."""

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("admin here")

    app = create_app(manager_with({"dense": FakeModel()}), extra_routes=[Route("/admin/hello", hello)])
    with TestClient(app) as client:
        assert ("admin here", 200) == (client.get("/admin/hello").text, client.get("/v1/models").status_code)


def test_models_lists_encoders_without_building_any() -> None:
    """GET /v1/models reads states only: no fake is built."""
    mgr = manager_with({"a": FakeModel(), "b": FakeModel()}, kinds={"b": "rerank"})
    with TestClient(create_app(mgr)) as client:
        data = client.get("/v1/models").json()["data"]
    assert [("a", "dense", "idle"), ("b", "rerank", "idle")] == [
        (m["id"], m["kind"], m["state"]) for m in data
    ]
    assert [False, False] == [p.loaded for p in mgr.proxies()]


def test_an_overloaded_encoder_is_a_429_with_retry_after() -> None:
    """OverloadedError from the encoder's queue becomes 429 with the encoder's retry_after_s."""
    mgr = manager_with({"dense": FakeModel(fail=lazyenc.OverloadedError("dense", max_queue=4))})
    with TestClient(create_app(mgr)) as client:
        response = client.post("/v1/embeddings", json={"model": "dense", "input": "x"})
    assert (429, "3", "overloaded") == (
        response.status_code,
        response.headers["retry-after"],
        error_of(response)["code"],
    )
    assert "4 requests already queued" in error_of(response)["message"]


def test_a_models_own_exception_is_a_500_with_its_message(caplog: pytest.LogCaptureFixture) -> None:
    """A failure inside the model is shown (type and message) and logged with its traceback, never hidden."""
    mgr = manager_with({"dense": FakeModel(fail=RuntimeError("CUDA out of memory (fake)"))})
    with TestClient(create_app(mgr)) as client, caplog.at_level(logging.ERROR, logger="lazyenc.server"):
        response = client.post("/v1/embeddings", json={"model": "dense", "input": "x"})
    assert (500, "RuntimeError: CUDA out of memory (fake)") == (
        response.status_code,
        error_of(response)["message"],
    )
    assert any(r.exc_info for r in caplog.records)


def test_without_keys_the_api_is_open() -> None:
    """No api_keys_env: requests need no Authorization header (the CLI keeps such a server on loopback)."""
    with TestClient(create_app(manager_with({"dense": FakeModel()}))) as client:
        assert 200 == client.post("/v1/embeddings", json={"model": "dense", "input": "x"}).status_code


def test_keys_come_from_the_variable_named_by_api_keys_env() -> None:
    """Comma-separated keys, spaces trimmed; a bearer token must match one."""
    mgr = manager_with({"dense": FakeModel()}, api_keys_env="KEYS")
    with TestClient(create_app(mgr, environ={"KEYS": " k1 , k2 "})) as client:
        ok = client.get("/v1/models", headers={"Authorization": "Bearer k2"})
        bad = client.get("/v1/models", headers={"Authorization": "Bearer k3"})
    assert (200, 401, "Bearer") == (ok.status_code, bad.status_code, bad.headers["www-authenticate"])


def test_api_keys_env_naming_an_unset_variable_is_a_config_error() -> None:
    """A server told to use keys never falls back to open when the variable is missing."""
    settings = lazyenc.ServerSettings(api_keys_env="NOT_SET_ANYWHERE")
    with pytest.raises(lazyenc.ConfigError, match="NOT_SET_ANYWHERE"):
        api_keys(settings, {})


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [("GET", "/v1/nothing", 404, "not_found"), ("GET", "/v1/embeddings", 405, "method_not_allowed")],
)
def test_routing_errors_under_v1_use_the_openai_shape(method: str, path: str, status: int, code: str) -> None:
    """Unknown paths and wrong methods answer in the same error shape as the endpoints."""
    with TestClient(create_app(manager_with({"dense": FakeModel()}))) as client:
        response = client.request(method, path)
    assert (status, code) == (response.status_code, error_of(response)["code"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"input": "x"}', "model"),
        (b'{"model": "dense", "input": []}', "input"),
        (b'{"model": "dense", "input": ["a", 3]}', "input"),
        (b'{"model": "dense", "input": "x", "encoding_format": "int8"}', "encoding_format"),
        (b'{"model": "dense", "input": "x", "dimensions": 0}', "dimensions"),
        (b'{"model": "dense", "input": "x", "dimensions": true}', "dimensions"),
        (b'{"model": "dense", "input": "x", "input_type": "passage"}', "input_type"),
    ],
)
def test_bad_embeddings_requests_are_400s_naming_the_field(body: bytes, param: str | None) -> None:
    """Malformed JSON and wrong fields get a 400 whose param names the field."""
    with TestClient(create_app(manager_with({"dense": FakeModel()}))) as client:
        response = client.post("/v1/embeddings", content=body)
    assert (400, param) == (response.status_code, error_of(response)["param"])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"documents": ["a", {"txt": "b"}]}, "documents"),
        ({"documents": []}, "documents"),
        ({"documents": ["a"], "top_n": 0}, "top_n"),
        ({"documents": ["a"], "return_documents": "yes"}, "return_documents"),
        ({"documents": ["a"], "query": 5}, "query"),
    ],
)
def test_bad_rerank_requests_are_400s_naming_the_field(extra: dict[str, Any], param: str) -> None:
    """Rerank validates documents, top_n, return_documents and query."""
    mgr = manager_with({"rr": FakeModel()}, kinds={"rr": "rerank"})
    with TestClient(create_app(mgr)) as client:
        response = client.post("/v1/rerank", json={"model": "rr", "query": "q", **extra})
    assert (400, param) == (response.status_code, error_of(response)["param"])


def test_dimensions_on_a_non_normalizing_model_keep_the_plain_prefix() -> None:
    """As sentence-transformers' truncate_dim: no re-normalizing when vectors are not unit length."""
    model = FakeModel(dimension=8)
    with TestClient(create_app(manager_with({"dense": model}))) as client:
        answer = client.post(
            "/v1/embeddings", json={"model": "dense", "input": "abc", "dimensions": 3}
        ).json()
    expected = [round(x, 6) for x in FakeModel(dimension=8).encode("abc")[:3]]
    assert expected == [round(x, 6) for x in answer["data"][0]["embedding"]]


def test_sparse_rows_skip_zero_weights_and_name_tokens() -> None:
    """Only non-zero weights are sent; without a tokenizer the token names are the indices."""

    class Sparse(FakeModel):
        def encode(self, inputs: Any, **kwargs: Any) -> Any:
            return [[0.0, 1.5, 0.0, 0.25] for _ in inputs]

    mgr = manager_with({"sp": Sparse()}, kinds={"sp": "sparse"})
    with TestClient(create_app(mgr)) as client:
        answer = client.post("/v1/sparse", json={"model": "sp", "input": ["x"], "return_tokens": True}).json()
    assert [{"index": 0, "indices": [1, 3], "values": [1.5, 0.25], "tokens": ["1", "3"]}] == answer["data"]


def test_shutdown_closes_the_manager_unless_told_otherwise() -> None:
    """The lifespan's shutdown unloads every encoder; close_manager=False leaves the manager to its owner."""
    owned, borrowed = manager_with({"dense": FakeModel()}), manager_with({"dense": FakeModel()})
    with TestClient(create_app(owned)) as client:
        client.post("/v1/embeddings", json={"model": "dense", "input": "x"})
        assert owned["dense"].loaded
    with TestClient(create_app(borrowed, close_manager=False)):
        pass
    assert (True, False, False) == (owned.closed, owned["dense"].loaded, borrowed.closed)


def test_graceful_shutdown_finishes_the_in_flight_request_then_closes() -> None:
    """Once shutdown starts, new connections are refused, the running call ends with 200, then unload."""
    gate = threading.Event()
    model = FakeModel(gate=gate)
    mgr = manager_with({"dense": model})
    result: list[int] = []
    with ThreadServer(create_app(mgr)) as server:
        request = threading.Thread(
            target=lambda: result.append(
                httpx.post(
                    f"{server.url}/v1/embeddings", json={"model": "dense", "input": "x"}, timeout=60
                ).status_code
            ),
            daemon=True,
        )
        request.start()
        give_up = time.monotonic() + 60  # a guard against hanging, not a performance limit
        while model.calls == 0 and time.monotonic() < give_up:  # the call is in the model, held by the gate
            time.sleep(0.01)
        server.stop()
        refused = False
        while not refused and time.monotonic() < give_up:
            try:
                httpx.get(f"{server.url}/v1/models", timeout=1)
                time.sleep(0.05)
            except httpx.TransportError:
                refused = True
        closed_while_in_flight = mgr.closed
        gate.set()
        request.join(timeout=60)
        assert (1, True, False) == (model.calls, refused, closed_while_in_flight)
    assert ([200], True) == (result, mgr.closed)


# -- a remote proxy against a server of fakes ------------------------------------------------------
@pytest.fixture(scope="module")
def fake_server() -> Any:
    models = {
        "ok": FakeModel(dimension=8),
        "busy": FakeModel(fail=lazyenc.OverloadedError("busy", max_queue=2)),
        "boom": FakeModel(fail=ValueError("the model broke")),
    }
    with ThreadServer(create_app(manager_with(models))) as server:
        yield server


def remote(url: str, model: str) -> Any:
    settings = lazyenc.parse_config(f'[encoders.r]\nkind = "remote"\nurl = "{url}"\nmodel = "{model}"\n')
    return lazyenc.EncoderManager(settings)["r"]


def test_a_remote_429_is_an_overloaded_error_with_the_servers_message(fake_server: ThreadServer) -> None:
    """The server's queue-full answer arrives as OverloadedError, with Retry-After kept."""
    proxy = remote(fake_server.url, "busy")
    with pytest.raises(lazyenc.OverloadedError, match="2 requests already queued") as caught:
        proxy.encode("x")
    assert 3.0 == caught.value.retry_after_s  # type: ignore[attr-defined]
    proxy.close()


def test_a_remote_model_failure_is_a_remote_error_carrying_the_message(fake_server: ThreadServer) -> None:
    """A 500 from the server's model is a RemoteError with status 500 and the model's message."""
    proxy = remote(fake_server.url, "boom")
    with pytest.raises(lazyenc.RemoteError, match="ValueError: the model broke") as caught:
        proxy.encode(["x"])
    assert (500, "model_error") == (caught.value.status_code, caught.value.code)
    assert (1, 1) == (proxy.status().calls, proxy.status().errors)
    proxy.close()


async def test_a_remote_proxys_async_methods_raise_the_same_errors(fake_server: ThreadServer) -> None:
    """aencode maps errors like encode does."""
    proxy = remote(fake_server.url, "busy")
    with pytest.raises(lazyenc.OverloadedError):
        await proxy.aencode("x")
    await proxy.aclose()


def test_a_remote_proxy_refuses_options_it_cannot_send(fake_server: ThreadServer) -> None:
    """An encode option that would change the answer and is not sent over HTTP is a TypeError naming it."""
    proxy = remote(fake_server.url, "ok")
    with pytest.raises(TypeError, match="prompt_name"):
        proxy.encode("x", prompt_name="query")
    assert (8,) == proxy.encode("x", batch_size=4, show_progress_bar=False).shape
    proxy.close()


def test_serve_mounts_the_admin_panel_beside_the_api() -> None:
    """The server's app answers the admin panel and /metrics next to /v1, without loading anything."""
    from lazyenc.server import _admin_routes

    mgr = manager_with({"dense": FakeModel()})
    with TestClient(create_app(mgr, extra_routes=_admin_routes(mgr, {}))) as client:
        components = client.get("/admin/components").json()["components"]
        assert ["dense"] == [c["name"] for c in components]
        assert "idle" == components[0]["state"]
        assert 200 == client.get("/metrics").status_code
        assert 200 == client.get("/v1/models").status_code
    assert "idle" == mgr["dense"].state


def test_a_proxys_awaitable_variant_is_awaited_instead_of_a_thread() -> None:
    """When a proxy offers aencode (as batching proxies do), the endpoint awaits it."""
    mgr = manager_with({"dense": FakeModel()})
    seen: list[list[str]] = []

    async def aencode(texts: list[str], **kwargs: Any) -> list[list[float]]:
        seen.append(texts)
        return [[0.0, 1.0]] * len(texts)

    mgr["dense"].aencode = aencode
    with TestClient(create_app(mgr)) as client:
        answer = client.post("/v1/embeddings", json={"model": "dense", "input": ["a", "b"]}).json()
    assert ([["a", "b"]], [[0.0, 1.0], [0.0, 1.0]]) == (seen, [d["embedding"] for d in answer["data"]])


def test_an_invalid_input_from_the_batcher_is_a_400() -> None:
    """InvalidInputError (a bad item caught before batching) answers 400, not 500."""
    import asyncio

    from lazyenc import InvalidInputError
    from lazyenc._server_handlers import ApiError, call

    def bad() -> None:
        raise InvalidInputError("dense", "inputs[1]", "must be a str, got int 42")

    mgr = manager_with({"dense": FakeModel()})
    with pytest.raises(ApiError) as info:
        asyncio.run(call(mgr["dense"], bad))
    assert (400, "invalid_request_error") == (info.value.status, info.value.type)
    assert "inputs[1] must be a str" in str(info.value)
