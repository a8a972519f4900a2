"""The admin app through Starlette's TestClient, on fakes that count and hold builds."""

from __future__ import annotations

import re
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from lazyenc import AdminSettings, ComponentStatus, EncoderLoadError, EncoderManager
from lazyenc._admin_metrics import METRIC_NAMES
from lazyenc.admin import create_app, lifespan, process_info, routes
from lazyenc.testing import FakeLoader, make_settings

TOKEN = "s3cret-admin-token"
TOKEN_ENV = "LAZYENC_TEST_ADMIN_TOKEN"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENVIRON = {TOKEN_ENV: TOKEN}


def manager(
    loaders: dict[str, FakeLoader] | None = None,
    *,
    token_env: str | None = TOKEN_ENV,
    protect_reads: bool = False,
) -> EncoderManager:
    """A manager with dense/rerank/sparse/spacy encoders on fakes and an [admin] token_env."""
    loaders = loaders or {}
    kinds = {"dense": "dense", "rerank": "rerank", "sparse": "sparse", "spacy": "spacy"}
    settings = make_settings(kinds).replace(
        admin=AdminSettings(token_env=token_env, protect_reads=protect_reads),
    )
    return EncoderManager(settings, loaders={k: loaders.get(k) or FakeLoader() for k in kinds})


def wait_for(predicate: Callable[[], bool], *, what: str) -> None:
    """Poll until predicate() holds; a guard against a hang, not a speed check."""
    deadline = time.monotonic() + 30
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def states(client: TestClient) -> dict[str, str]:
    return {c["name"]: c["state"] for c in client.get("/admin/components").json()["components"]}


@pytest.fixture
def held() -> Iterator[tuple[EncoderManager, FakeLoader, threading.Event]]:
    """A manager whose dense build blocks until the event is set (set on teardown too)."""
    gate = threading.Event()
    loader = FakeLoader(gate=gate)
    mgr = manager({"dense": loader})
    try:
        yield mgr, loader, gate
    finally:
        gate.set()
        mgr.close()


# -- reads never build -----------------------------------------------------------------
def test_components_lists_every_status_field_and_the_process() -> None:
    """/admin/components holds process facts, lazy_encoders and every ComponentStatus field."""
    mgr = manager()
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        doc = client.get("/admin/components").json()
    assert {"pid", "rss_bytes", "rss_human", "uptime_s", "torch_imported", "cuda"} == set(doc["process"])
    assert True is doc["lazy_encoders"]
    assert ["dense", "rerank", "sparse", "spacy"] == [c["name"] for c in doc["components"]]
    fields = set(ComponentStatus.field_names())
    assert {"loading_for_s", "rss_delta_bytes"} <= fields
    assert all(fields == set(c) for c in doc["components"])
    assert doc["process"]["rss_bytes"] > 0


def test_reads_never_build_a_model() -> None:
    """Every GET endpoint, many times over, leaves the counting fakes at zero builds."""
    loaders = {k: FakeLoader() for k in ("dense", "rerank", "sparse", "spacy")}
    mgr = manager(loaders)
    paths = ["/admin", "/admin/components", "/admin/components/dense", "/admin/health", "/admin/ready"]
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        for _ in range(3):
            for path in [*paths, "/metrics"]:
                assert 200 == client.get(path).status_code, path
        assert {"dense": "idle", "rerank": "idle", "sparse": "idle", "spacy": "idle"} == states(client)
    assert {"dense": 0, "rerank": 0, "sparse": 0, "spacy": 0} == {k: v.builds for k, v in loaders.items()}


def test_panel_shows_loading_while_a_build_is_held(
    held: tuple[EncoderManager, FakeLoader, threading.Event],
) -> None:
    """While a build waits on an Event, JSON, HTML and metrics answer and say 'loading'."""
    mgr, loader, gate = held
    caller = threading.Thread(target=mgr["dense"].encode, args=(["hello"],))
    caller.start()
    assert loader.started.wait(30)
    with TestClient(create_app(mgr, environ=ENVIRON)) as client, ThreadPoolExecutor(1) as pool:
        # Run the requests in a worker so that a panel waiting on the build lock fails the test, not hangs it.
        doc = pool.submit(client.get, "/admin/components").result(timeout=30).json()
        page = pool.submit(client.get, "/admin").result(timeout=30).text
        metrics = pool.submit(client.get, "/metrics").result(timeout=30).text
        dense = doc["components"][0]
        assert ("dense", "loading", False) == (dense["name"], dense["state"], dense["loaded"])
        assert dense["loading_for_s"] >= 0
        assert 'id="component-dense" class="component state-loading"' in page
        assert 'lazyenc_encoder_state{encoder="dense",kind="dense",state="loading"} 1.0' in metrics
        gate.set()
        caller.join()
        assert "loaded" == states(client)["dense"]
    assert 1 == loader.builds


# -- load / unload / reset ------------------------------------------------------------
def test_load_answers_202_and_builds_in_the_background(
    held: tuple[EncoderManager, FakeLoader, threading.Event],
) -> None:
    """POST load returns 202 at once, the panel shows loading, a second load starts no second build."""
    mgr, loader, gate = held
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        first = client.post("/admin/components/dense/load", headers=AUTH)
        assert (202, True) == (first.status_code, first.json()["accepted"])
        assert loader.started.wait(30)
        assert "loading" == states(client)["dense"]
        again = client.post("/admin/components/dense/load", headers=AUTH)
        assert (202, "already loading") == (again.status_code, again.json()["message"])
        gate.set()
        wait_for(lambda: mgr["dense"].state == "loaded", what="the background build")
        done = client.post("/admin/components/dense/load", headers=AUTH)
        assert (200, False, "loaded") == (
            done.status_code,
            done.json()["accepted"],
            done.json()["component"]["state"],
        )
    assert 1 == loader.builds


def test_load_of_a_disabled_encoder_answers_409_with_the_reason_and_reset_clears_it() -> None:
    """A failed build makes load answer 409 naming the error; reset returns the encoder to idle."""
    loader = FakeLoader(fail=RuntimeError("weights are corrupt"))
    mgr = manager({"dense": loader})
    with pytest.raises(EncoderLoadError):
        mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        refused = client.post("/admin/components/dense/load", headers=AUTH)
        assert 409 == refused.status_code
        assert "RuntimeError: weights are corrupt" in refused.json()["error"]["message"]
        loader.fail = None
        reset = client.post("/admin/components/dense/reset", headers=AUTH)
        assert (200, "idle") == (reset.status_code, reset.json()["component"]["state"])
        assert 202 == client.post("/admin/components/dense/load", headers=AUTH).status_code
        wait_for(lambda: mgr["dense"].state == "loaded", what="the background build")
    assert 2 == loader.builds


def test_a_background_load_refused_by_the_memory_budget_shows_why_on_the_panel() -> None:
    """POST load answers 202; the build is refused for the budget; the component stays idle with the reason."""
    kinds = {"dense": "dense"}
    settings = make_settings(kinds, memory_budget_mb=1).replace(admin=AdminSettings(token_env=TOKEN_ENV))
    loader = FakeLoader(weight_bytes=10 * 2**20)
    with EncoderManager(settings, loaders={"dense": loader}) as mgr:
        with TestClient(create_app(mgr, environ=ENVIRON)) as client:
            assert 202 == client.post("/admin/components/dense/load", headers=AUTH).status_code
            wait_for(lambda: mgr["dense"].reason != "", what="the refused background build")
            component = client.get("/admin/components").json()["components"][0]
            page = client.get("/admin").text
    assert ("idle", 0) == (component["state"], loader.builds)
    assert component["reason"].startswith("last build refused: ")
    assert "memory_budget_mb = 1" in component["reason"]
    assert "last build refused" in page


def test_load_of_an_unavailable_encoder_answers_409() -> None:
    """An encoder whose probe failed cannot be loaded from the panel; the reason is given."""
    mgr = manager({"spacy": FakeLoader(available=False, reason="spaCy is not installed")})
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        response = client.post("/admin/components/spacy/load", headers=AUTH)
    assert 409 == response.status_code
    assert "spaCy is not installed" in response.json()["error"]["message"]


def test_load_after_the_manager_closed_answers_409() -> None:
    """A closed manager builds nothing, and load says why."""
    mgr = manager()
    mgr.close()
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        response = client.post("/admin/components/dense/load", headers=AUTH)
    assert (409, "the manager is closed") == (response.status_code, response.json()["error"]["message"])


def test_unload_drops_a_loaded_model() -> None:
    """POST unload returns the encoder to idle; a second unload reports there was nothing to drop."""
    mgr = manager()
    mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        first = client.post("/admin/components/dense/unload", headers=AUTH).json()
        second = client.post("/admin/components/dense/unload", headers=AUTH).json()
    assert (True, "idle") == (first["unloaded"], first["component"]["state"])
    assert False is second["unloaded"]
    assert None is mgr["dense"].peek()


def test_unload_and_reset_while_loading_answer_409_at_once(
    held: tuple[EncoderManager, FakeLoader, threading.Event],
) -> None:
    """unload and reset refuse a loading encoder instead of waiting for the build to finish."""
    mgr, loader, gate = held
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        client.post("/admin/components/dense/load", headers=AUTH)
        assert loader.started.wait(30)
        codes = [
            client.post(f"/admin/components/dense/{a}", headers=AUTH).status_code for a in ("unload", "reset")
        ]
        gate.set()
        wait_for(lambda: mgr["dense"].state == "loaded", what="the background build")
    assert [409, 409] == codes


# -- tokens -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {TOKEN}"}, 401),
        ({"Authorization": f"Bearer {TOKEN}x"}, 401),
        ({"Authorization": "Bearer tökén".encode()}, 401),
        (AUTH, 200),
    ],
)
def test_writes_need_the_bearer_token(headers: dict[str, Any], expected: int) -> None:
    """Only the exact token from the variable named by [admin] token_env is let through."""
    with TestClient(create_app(manager(), environ=ENVIRON)) as client:
        response = client.post("/admin/components/dense/unload", headers=headers)
    assert expected == response.status_code
    if expected == 401:
        assert 'Bearer realm="lazyenc admin"' == response.headers["www-authenticate"]
        assert "Authorization: Bearer" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("token_env", "environ"),
    [(None, ENVIRON), (TOKEN_ENV, {}), (TOKEN_ENV, {TOKEN_ENV: "  "})],
    ids=["no-token_env", "variable-unset", "variable-blank"],
)
def test_writes_answer_403_when_no_token_is_configured(
    token_env: str | None, environ: dict[str, str]
) -> None:
    """Without a configured token every write is refused with 403, whatever the request sends."""
    with TestClient(create_app(manager(token_env=token_env), environ=environ)) as client:
        responses = [
            client.post(f"/admin/components/dense/{a}", headers=AUTH) for a in ("load", "unload", "reset")
        ]
    assert [403, 403, 403] == [r.status_code for r in responses]
    assert "no admin token is configured" in responses[0].json()["error"]["message"]


def test_an_explicit_token_argument_wins_over_the_environment() -> None:
    """create_app(token=...) is the token; the environment's is then not accepted."""
    with TestClient(create_app(manager(), token="from-code", environ=ENVIRON)) as client:
        ok = client.post("/admin/components/dense/unload", headers={"Authorization": "Bearer from-code"})
        env = client.post("/admin/components/dense/unload", headers=AUTH)
    assert (200, 401) == (ok.status_code, env.status_code)


def test_protect_reads_puts_the_token_on_the_read_endpoints() -> None:
    """With protect_reads the page, JSON and metrics need the token; health stays open."""
    mgr = manager(protect_reads=True)
    reads = ["/admin", "/admin/components", "/admin/components/dense", "/metrics"]
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        without = [client.get(p).status_code for p in reads]
        wrong = [client.get(p, headers={"Authorization": "Bearer no"}).status_code for p in reads]
        with_token = [client.get(p, headers=AUTH).status_code for p in reads]
        health = client.get("/admin/health").status_code
    assert ([401] * 4, [401] * 4, [200] * 4, 200) == (without, wrong, with_token, health)


def test_protect_reads_without_a_configured_token_answers_403() -> None:
    """protect_reads with no token refuses reads with 403 rather than opening them."""
    with TestClient(create_app(manager(protect_reads=True), environ={})) as client:
        assert 403 == client.get("/admin/components", headers=AUTH).status_code


def test_ready_hides_error_messages_from_callers_without_the_token_under_protect_reads() -> None:
    """Under protect_reads /admin/ready gives probes the verdict and names; details need the token."""
    mgr = manager({"dense": FakeLoader(fail=RuntimeError("/secret/path is corrupt"))}, protect_reads=True)
    with pytest.raises(EncoderLoadError):
        mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        anonymous = client.get("/admin/ready")
        operator = client.get("/admin/ready", headers=AUTH)
    assert (503, ["encoder 'dense' is disabled"]) == (anonymous.status_code, anonymous.json()["reasons"])
    assert "/secret/path is corrupt" in operator.json()["reasons"][0]


# -- health and readiness ----------------------------------------------------------------------
def test_ready_is_503_with_reasons_while_an_encoder_is_disabled() -> None:
    """A disabled encoder makes /admin/ready 503 naming it; an unavailable one does not."""
    mgr = manager(
        {
            "dense": FakeLoader(fail=OSError("no weights")),
            "spacy": FakeLoader(available=False, reason="not installed"),
        }
    )
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        before = client.get("/admin/ready")
        with pytest.raises(EncoderLoadError):
            mgr["dense"].encode(["x"])
        after = client.get("/admin/ready")
        health = client.get("/admin/health")
    assert (200, {"ready": True, "reasons": []}) == (before.status_code, before.json())
    assert (503, False) == (after.status_code, after.json()["ready"])
    assert ["encoder 'dense' is disabled: OSError: no weights"] == after.json()["reasons"]
    assert (200, "ok") == (health.status_code, health.json()["status"])


def test_ready_is_503_until_eager_warmup_finishes() -> None:
    """While the manager says eager warm-up is not done, /admin/ready answers 503 and says so."""
    mgr = manager()
    mgr.eager_warmup_done = False
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        waiting = client.get("/admin/ready")
        mgr.eager_warmup_done = True
        done = client.get("/admin/ready")
    assert (503, ["eager warm-up has not finished"]) == (waiting.status_code, waiting.json()["reasons"])
    assert 200 == done.status_code


# -- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "expected", "fragment"),
    [
        ("GET", "/admin/components/nope", 404, "no encoder named 'nope'; configured: dense, rerank"),
        ("POST", "/admin/components/nope/load", 404, "no encoder named 'nope'"),
        (
            "POST",
            "/admin/components/dense/explode",
            404,
            "unknown action 'explode'; valid: load, unload, reset",
        ),
        ("GET", "/admin/components/dense/explode", 404, "unknown action 'explode'"),
        ("GET", "/no/such/page", 404, "no such path: /no/such/page"),
        ("GET", "/admin/components/dense/load", 405, "use POST"),
        ("POST", "/admin/components", 405, "use GET"),
        ("DELETE", "/metrics", 405, "use GET"),
        ("PUT", "/admin/health", 405, "use GET"),
        ("POST", "/admin/ready", 405, "use GET"),
        ("POST", "/admin", 405, "use GET"),
    ],
)
def test_errors_are_json_with_a_message(method: str, path: str, expected: int, fragment: str) -> None:
    """Unknown component or action or path is a JSON 404, a wrong method a JSON 405 with Allow."""
    with TestClient(create_app(manager(), environ=ENVIRON)) as client:
        response = client.request(method, path, headers=AUTH)
    assert expected == response.status_code
    assert "application/json" == response.headers["content-type"]
    assert fragment in response.json()["error"]["message"]
    assert expected == response.json()["error"]["code"]
    if expected == 405:
        assert response.headers["allow"] in ("GET, HEAD", "POST")


def test_head_on_health_answers_200() -> None:
    """HEAD works wherever GET does (load balancers probe with it)."""
    with TestClient(create_app(manager(), environ=ENVIRON)) as client:
        assert 200 == client.head("/admin/health").status_code


# -- metrics ---------------------------------------------------------------------------------
def test_metrics_expose_state_calls_errors_builds_and_rss() -> None:
    """/metrics is Prometheus text with every lazyenc metric, counting calls and errors per encoder."""
    boom = FakeLoader(model_factory=lambda: _Failing())
    mgr = manager({"rerank": boom})
    mgr["dense"].encode(["a"])
    mgr["dense"].encode(["b"])
    with pytest.raises(ValueError):
        mgr["rerank"].predict([("q", "d")])
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        response = client.get("/metrics")
    text = response.text
    assert response.headers["content-type"].startswith("text/plain")
    assert [] == [name for name in METRIC_NAMES if f"# HELP {name} " not in text]
    assert 'lazyenc_encoder_calls_total{encoder="dense",kind="dense"} 2.0' in text
    assert 'lazyenc_encoder_errors_total{encoder="rerank",kind="rerank"} 1.0' in text
    assert 'lazyenc_encoder_loaded{encoder="dense",kind="dense"} 1.0' in text
    assert 'lazyenc_encoder_loaded{encoder="sparse",kind="sparse"} 0.0' in text
    assert re.search(r'lazyenc_encoder_build_seconds\{encoder="dense",kind="dense"\} \d', text)
    assert re.search(r"\nlazyenc_process_rss_bytes \d", text)


class _Failing:
    def predict(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("model code failed")


def test_each_app_has_its_own_registry() -> None:
    """Two apps in one process both serve metrics, and nothing lands in the global registry."""
    first, second = manager(), manager()
    second["dense"].encode(["x"])
    with (
        TestClient(create_app(first, environ=ENVIRON)) as a,
        TestClient(create_app(second, environ=ENVIRON)) as b,
    ):
        loaded_a = 'lazyenc_encoder_loaded{encoder="dense",kind="dense"} 0.0' in a.get("/metrics").text
        loaded_b = 'lazyenc_encoder_loaded{encoder="dense",kind="dense"} 1.0' in b.get("/metrics").text
    assert (True, True) == (loaded_a, loaded_b)
    assert None is REGISTRY.get_sample_value("lazyenc_process_rss_bytes")


# -- the HTML page ------------------------------------------------------------------------------
def test_page_renders_a_row_per_encoder_with_its_state() -> None:
    """GET /admin is server-rendered HTML with a row and a state per encoder, refreshing itself."""
    mgr = manager({"spacy": FakeLoader(available=False, reason="not installed")})
    mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ=ENVIRON, refresh_s=3)) as client:
        response = client.get("/admin")
    page = response.text
    assert response.headers["content-type"].startswith("text/html")
    assert '<meta http-equiv="refresh" content="3">' in page
    found = dict(
        re.findall(r'<tr id="component-[^"]+" class="[^"]+" data-name="([^"]+)" data-state="([^"]+)"', page)
    )
    assert {"dense": "loaded", "rerank": "idle", "sparse": "idle", "spacy": "unavailable"} == found
    assert "<script" not in page
    assert [] == re.findall(r'(?:src|href)="https?://', page)


def test_page_escapes_every_text() -> None:
    """Reasons and names reach the page escaped, so markup in an error message stays text."""
    mgr = manager({"spacy": FakeLoader(available=False, reason='<script>alert("x")</script>')})
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        page = client.get("/admin").text
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_page_without_refresh_when_refresh_s_is_zero() -> None:
    """refresh_s=0 turns the auto refresh off."""
    with TestClient(create_app(manager(), environ=ENVIRON, refresh_s=0)) as client:
        assert 'http-equiv="refresh"' not in client.get("/admin").text


class _StatusWithMore(ComponentStatus):
    future_field: float | None = None


def test_fields_other_issues_add_to_componentstatus_show_up_generically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A field the panel does not know appears in the JSON and as its own column in the page."""
    mgr = manager()
    proxy = mgr["dense"]
    original = proxy.status
    monkeypatch.setattr(proxy, "status", lambda: _StatusWithMore(**original().as_dict(), future_field=12.5))
    with TestClient(create_app(mgr, environ=ENVIRON)) as client:
        doc = client.get("/admin/components").json()
        page = client.get("/admin").text
    assert 12.5 == doc["components"][0]["future_field"]
    assert '<th scope="col">future_field</th>' in page
    assert '<td class="extra extra-future_field">12.5</td>' in page


# -- process facts ------------------------------------------------------------------------------
def test_cuda_is_null_unless_torch_is_already_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """process_info reports cuda None without torch, [] when CUDA is not initialised, per device otherwise."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    without = process_info()
    cuda = types.SimpleNamespace(
        is_initialized=lambda: False,
        device_count=lambda: 1,
        get_device_name=lambda i: "Fake GPU",
        memory_allocated=lambda i: 1024,
        memory_reserved=lambda i: 2048,
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    uninitialised = process_info()["cuda"]
    cuda.is_initialized = lambda: True
    initialised = process_info()["cuda"]
    assert (None, False) == (without["cuda"], without["torch_imported"])
    assert [] == uninitialised
    assert [{"device": 0, "name": "Fake GPU", "allocated_bytes": 1024, "reserved_bytes": 2048}] == initialised


# -- lifespan and mounting --------------------------------------------------------------------
def test_closing_the_app_leaves_the_hosts_models_loaded() -> None:
    """By default the app's lifespan does not touch the manager on shutdown."""
    mgr = manager()
    mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ=ENVIRON)):
        pass
    assert (False, "loaded") == (mgr.closed, mgr["dense"].state)


def test_close_manager_on_shutdown_closes_it() -> None:
    """create_app(close_manager_on_shutdown=True) unloads and closes the manager when the app stops."""
    mgr = manager()
    mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ=ENVIRON, close_manager_on_shutdown=True)):
        pass
    assert (True, "idle") == (mgr.closed, mgr["dense"].state)


def test_lifespan_closes_the_manager_of_a_host_app() -> None:
    """lazyenc.admin.lifespan(mgr) is a Starlette lifespan that closes the manager on shutdown."""
    mgr = manager()
    mgr["dense"].encode(["x"])
    with TestClient(Starlette(lifespan=lifespan(mgr))):
        assert False is mgr.closed
    assert (True, None) == (mgr.closed, mgr["dense"].peek())


def test_app_mounts_under_any_path() -> None:
    """Mounted at /ops the panel serves /ops/admin and links to its JSON under /ops."""
    host = Starlette(routes=[Mount("/ops", app=create_app(manager(), environ=ENVIRON))])
    with TestClient(host) as client:
        components = client.get("/ops/admin/components")
        page = client.get("/ops/admin").text
        metrics = client.get("/ops/metrics")
    assert (200, 200) == (components.status_code, metrics.status_code)
    assert 'href="/ops/admin/components"' in page
    assert 'href="/ops/metrics"' in page


def test_app_with_an_empty_prefix_serves_at_the_mount_point() -> None:
    """prefix='' puts the panel at the mount's root: Mount('/admin', create_app(m, prefix=''))."""
    host = Starlette(routes=[Mount("/admin", app=create_app(manager(), environ=ENVIRON, prefix=""))])
    with TestClient(host) as client:
        assert 4 == len(client.get("/admin/components").json()["components"])
        assert "data-state" in client.get("/admin/").text


def test_routes_join_a_host_app_and_keep_json_errors() -> None:
    """routes(mgr) go into a host's own route list; their wrong methods still answer JSON 405."""

    async def hello(request: Any) -> Any:
        from starlette.responses import PlainTextResponse

        return PlainTextResponse("hello")

    mgr = manager()
    host = Starlette(routes=[Route("/", hello), *routes(mgr, environ=ENVIRON)])
    with TestClient(host) as client:
        assert "hello" == client.get("/").text
        assert 4 == len(client.get("/admin/components").json()["components"])
        wrong = client.get("/admin/components/dense/load")
        assert (405, "GET is not allowed here; use POST") == (
            wrong.status_code,
            wrong.json()["error"]["message"],
        )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"prefix": "admin"}, "prefix must be"),
        ({"prefix": "/admin/"}, "prefix must be"),
        ({"metrics_path": "metrics"}, "metrics_path must start with '/'"),
        ({"refresh_s": -1}, "refresh_s must be >= 0"),
    ],
)
def test_bad_app_options_raise_a_clear_error(kwargs: dict[str, Any], fragment: str) -> None:
    """A malformed prefix, metrics path or refresh interval is refused when the app is built."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        create_app(manager(), **kwargs)


# -- optional dependencies -------------------------------------------------------------------------
def test_importing_lazyenc_admin_imports_no_web_library() -> None:
    """`import lazyenc.admin` stays cheap: starlette, uvicorn and prometheus_client load on first use."""
    import subprocess

    code = (
        "import sys, lazyenc.admin; "
        "print(sorted(m for m in ('starlette', 'uvicorn', 'prometheus_client', 'psutil', 'torch') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "[]" == out.stdout.strip()


def test_a_missing_admin_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without starlette installed, create_app raises ImportError naming `lazyenc[admin]`."""
    monkeypatch.setitem(sys.modules, "starlette", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'lazyenc[admin]'")):
        create_app(manager())


def test_lazyenc_admin_subcommand_takes_config_host_and_port() -> None:
    """`lazyenc admin --config F --host H --port P` parses into the admin command."""
    from lazyenc._cli import build_parser, cmd_admin

    args = build_parser().parse_args(["admin", "--config", "x.toml", "--host", "0.0.0.0", "--port", "9001"])
    assert ("x.toml", "0.0.0.0", 9001, cmd_admin) == (args.config, args.host, args.port, args.func)
    defaults = build_parser().parse_args(["admin"])
    assert (None, None) == (defaults.host, defaults.port)


def test_lazyenc_admin_without_the_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing starlette makes `lazyenc admin` print one line naming lazyenc[admin] and exit 1."""
    from lazyenc._cli import main

    config = tmp_path / "lazyenc.toml"
    config.write_text("")
    monkeypatch.setitem(sys.modules, "starlette", None)
    assert 1 == main(["admin", "--config", str(config)])
    assert (
        "lazyenc: the admin panel needs starlette: pip install 'lazyenc[admin]'\n" == capsys.readouterr().err
    )


def test_metrics_answer_openmetrics_when_the_scraper_asks_for_it() -> None:
    """An Accept of application/openmetrics-text gets OpenMetrics; plain scrapes get Prometheus text."""
    with TestClient(create_app(manager(), environ=ENVIRON)) as client:
        plain = client.get("/metrics")
        om = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")


def test_the_page_under_protect_reads_takes_basic_auth_so_a_browser_can_log_in() -> None:
    """With protect_reads the page challenges with Basic and accepts the token as password; writes do not."""
    import base64

    basic = {"Authorization": "Basic " + base64.b64encode(f"admin:{TOKEN}".encode()).decode()}
    with TestClient(create_app(manager(protect_reads=True), environ=ENVIRON)) as client:
        challenge = client.get("/admin")
        page = client.get("/admin", headers=basic)
        garbage = client.get("/admin", headers={"Authorization": "Basic %%%"})
        write = client.post("/admin/components/dense/unload", headers=basic)
    assert (401, 'Basic realm="lazyenc admin"') == (
        challenge.status_code,
        challenge.headers["www-authenticate"],
    )
    assert (200, 401, 401) == (page.status_code, garbage.status_code, write.status_code)


def test_page_shows_when_an_idle_encoder_will_unload() -> None:
    """With idle_unload_s set, the page shows the unload deadline as a countdown, not an epoch."""
    settings = make_settings({"dense": "dense"}, idle_unload_s=600)
    mgr = EncoderManager(settings, loaders={"dense": FakeLoader()})
    mgr["dense"].encode(["x"])
    with TestClient(create_app(mgr, environ={})) as client:
        doc = client.get("/admin/components").json()
        page = client.get("/admin").text
    deadline = doc["components"][0]["idle_unload_at"]
    assert deadline is not None and deadline > time.time()
    row = re.search(r'<tr id="component-dense".*?</tr>', page, re.S)
    assert row is not None
    assert re.search(r'<td class="time" title="[^"]+ UTC">in (9|10) min</td>', row.group(0))
    mgr.close()


def test_page_shows_batching_figures() -> None:
    """Batches run, mean batch size and queue depth have their own columns."""
    mgr = EncoderManager(make_settings({"dense": "dense"}), loaders={"dense": FakeLoader()})
    mgr["dense"].encode(["a", "b", "c"])
    with TestClient(create_app(mgr, environ={})) as client:
        page = client.get("/admin").text
        doc = client.get("/admin/components").json()
    assert (1, 3.0, 0) == tuple(
        doc["components"][0][k] for k in ("batches_run", "mean_batch_size", "queue_depth")
    )
    headers = re.findall(r'<th scope="col">([^<]+)</th>', page)
    assert ["batches", "mean batch", "queued"] == headers[
        headers.index("retry") + 1 : headers.index("reason")
    ]
    row = re.search(r'<tr id="component-dense".*?</tr>', page, re.S)
    assert row is not None
    assert '<td class="num">1</td><td class="num">3</td><td class="num">0</td>' in row.group(0)
    mgr.close()
