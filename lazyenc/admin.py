"""The admin panel: what is loaded and what the process costs, without loading anything.

    from lazyenc.admin import create_app
    app = create_app(manager)   # a Starlette app; mount it anywhere

Reads (``GET /admin``, ``/admin/components``, ``/admin/health``, ``/admin/ready``,
``/metrics``) only take the manager's lock-free snapshots: they never build a
model, never import torch and never wait on a build lock, so the panel answers
at once during a build and shows ``loading``. Writes (``POST
/admin/components/NAME/load|unload|reset``) need ``Authorization: Bearer TOKEN``.
``load`` answers 202 and builds in a background thread. See docs/admin.md.

starlette, uvicorn and prometheus_client are imported inside the functions
(``pip install 'lazyenc[admin]'``).
"""

from __future__ import annotations

import base64
import hmac
import http
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._admin_html import render_page
from ._admin_metrics import metrics_registry
from ._exceptions import LazyEncError, UnknownEncoderError
from ._manager import EncoderManager
from ._memory import lifespan
from ._process import human_bytes, rss_bytes, torch_imported, uptime_s

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

__all__ = ["ACTIONS", "create_app", "lifespan", "process_info", "readiness", "routes", "serve", "snapshot"]

log = logging.getLogger("lazyenc")

ACTIONS = ("load", "unload", "reset")
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
# Starlette would default a function endpoint to GET and answer other methods with plain text.
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _require_admin_extra(*modules: str) -> None:
    import importlib

    for module in ("prometheus_client", "starlette", *modules):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ImportError(
                f"the admin panel needs {module}: pip install 'lazyenc[admin]'", name=module
            ) from None


# -- what the panel shows (plain functions: no web framework needed) ----------------
def _cuda_memory() -> list[dict[str, Any]] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None  # never import torch to answer a status read
    cuda = getattr(torch, "cuda", None)  # None while another thread is still importing torch
    try:
        # is_initialized() does not initialise CUDA; anything more would break forked children.
        if cuda is None or not cuda.is_initialized():
            return []
        return [
            {
                "device": i,
                "name": str(cuda.get_device_name(i)),
                "allocated_bytes": int(cuda.memory_allocated(i)),
                "reserved_bytes": int(cuda.memory_reserved(i)),
            }
            for i in range(cuda.device_count())
        ]
    except Exception as exc:  # a status page reports a broken driver instead of failing
        return [{"error": f"{type(exc).__name__}: {exc}"}]


def process_info() -> dict[str, Any]:
    """pid, RSS, uptime, whether torch is imported, and CUDA memory per device (None without torch)."""
    rss = rss_bytes()
    return {
        "pid": os.getpid(),
        "rss_bytes": rss,
        "rss_human": human_bytes(rss),
        "uptime_s": round(uptime_s(), 3),
        "torch_imported": torch_imported(),
        "cuda": _cuda_memory(),
    }


def snapshot(manager: EncoderManager) -> dict[str, Any]:
    """The ``/admin/components`` document; builds nothing and takes no lock."""
    return {
        "process": process_info(),
        "lazy_encoders": manager.lazy_encoders,
        "eager_warmup_done": manager.eager_warmup_done,
        "components": [s.as_dict() for s in manager.status()],
    }


def readiness(manager: EncoderManager) -> tuple[bool, list[str]]:
    """(ready, reasons): not ready while eager warm-up runs or any encoder is disabled."""
    reasons = []
    if not manager.eager_warmup_done:
        reasons.append("eager warm-up has not finished")
    for s in manager.status():
        if s.state == "disabled":
            reasons.append(f"encoder {s.name!r} is disabled: {s.reason}")
    return not reasons, reasons


# -- the web layer ---------------------------------------------------------------------
def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    from starlette.responses import JSONResponse

    kind = http.HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _wrong_method(request: Request, method: str = "GET") -> Response | None:
    """A JSON 405 unless the request uses ``method`` (GET admits HEAD)."""
    allowed = ("GET", "HEAD") if method == "GET" else (method,)
    if request.method in allowed:
        return None
    return _error(405, f"{request.method} is not allowed here; use {method}", {"Allow": ", ".join(allowed)})


def _json(body: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status)


def _resolve_token(manager: EncoderManager, token: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """(token, why-none): the explicit token, else the variable named by [admin] token_env."""
    if token:
        return token, ""
    env = manager.settings.admin.token_env
    if not env:
        return "", "no admin token is configured: set [admin] token_env to an environment variable's name"
    value = environ.get(env, "").strip()
    if not value:
        return (
            "",
            f"no admin token is configured: the environment variable {env} ([admin] token_env) is empty",
        )
    return value, ""


_Endpoint = Callable[["Request"], Awaitable["Response"]]


class _Panel:
    """The endpoints of one app, bound to one manager and one token."""

    def __init__(
        self,
        manager: EncoderManager,
        *,
        token: str | None,
        environ: Mapping[str, str],
        protect_reads: bool | None,
        prefix: str,
        metrics_path: str,
        refresh_s: float,
    ) -> None:
        if prefix and (not prefix.startswith("/") or prefix.endswith("/")):
            raise ValueError(f"prefix must be '' or start with '/' and not end with '/', got {prefix!r}")
        if not metrics_path.startswith("/"):
            raise ValueError(f"metrics_path must start with '/', got {metrics_path!r}")
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be >= 0, got {refresh_s!r}")
        self.manager = manager
        self.token, self.no_token_reason = _resolve_token(manager, token, environ)
        self.protect_reads = manager.settings.admin.protect_reads if protect_reads is None else protect_reads
        self.prefix = prefix
        self.metrics_path = metrics_path
        self.refresh_s = refresh_s
        self.registry = metrics_registry(manager)

    # -- plumbing ----------------------------------------------------------------
    def _denied(self, request: Request, *, basic: bool = False) -> Response | None:
        """None when the request may pass; else the 403 (no token configured) or 401.

        ``basic``: also take HTTP Basic with the token as password, and challenge
        with Basic, so that a browser prompts for it (the page under protect_reads).
        """
        if not self.token:
            return _error(403, self.no_token_reason)
        given = _credential(request.headers.get("authorization", ""), basic=basic)
        # compare_digest on bytes: str arguments must be ASCII, a header need not be.
        if given is None or not hmac.compare_digest(given, self.token.encode("utf-8", "surrogateescape")):
            challenge = "Basic" if basic else "Bearer"
            return _error(
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": f'{challenge} realm="lazyenc admin"'},
            )
        return None

    def _read(self, endpoint: _Endpoint, *, basic: bool = False) -> _Endpoint:
        """GET/HEAD only (JSON 405 otherwise, whatever app hosts the route), token if protect_reads."""

        async def guarded(request: Request) -> Response:
            wrong = _wrong_method(request)
            if wrong is not None:
                return wrong
            if self.protect_reads:
                denied = self._denied(request, basic=basic)
                if denied is not None:
                    return denied
            return await endpoint(request)

        return guarded

    def _url(self, request: Request, path: str) -> str:
        return str(request.scope.get("root_path", "")) + path

    # -- reads (async: answered on the event loop, never queued behind a worker thread) ----
    async def components(self, request: Request) -> Response:
        return _json(snapshot(self.manager))

    async def component(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.manager:
            return _error(404, str(UnknownEncoderError(name, self.manager)))
        return _json(self.manager[name].status().as_dict())

    async def page(self, request: Request) -> Response:
        from starlette.responses import HTMLResponse

        html = render_page(
            snapshot(self.manager),
            ready=readiness(self.manager),
            refresh_s=self.refresh_s,
            json_url=self._url(request, f"{self.prefix}/components"),
            metrics_url=self._url(request, self.metrics_path),
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def health(self, request: Request) -> Response:
        return _wrong_method(request) or _json({"status": "ok", "pid": os.getpid()})

    async def ready(self, request: Request) -> Response:
        wrong = _wrong_method(request)
        if wrong is not None:
            return wrong
        ok, reasons = readiness(self.manager)
        if self.protect_reads and self._denied(request) is not None:
            # Probes send no token: they get the verdict, not the error messages.
            reasons = [r.split(":", 1)[0] for r in reasons]
        return _json({"ready": ok, "reasons": reasons}, 200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        from prometheus_client.exposition import choose_encoder
        from starlette.responses import Response

        # The scraper's Accept header picks the format (Prometheus text 0.0.4 or OpenMetrics).
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(self.registry), headers={"Content-Type": content_type})

    # -- writes ---------------------------------------------------------------------
    async def action(self, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        name, action = request.path_params["name"], request.path_params["action"]
        if action not in ACTIONS:
            return _error(404, f"unknown action {action!r}; valid: {', '.join(ACTIONS)}")
        wrong = _wrong_method(request, "POST")
        if wrong is not None:
            return wrong
        denied = self._denied(request)
        if denied is not None:
            return denied
        if name not in self.manager:
            return _error(404, str(UnknownEncoderError(name, self.manager)))
        proxy = self.manager[name]
        if action == "load":
            return self._load(name, proxy)
        if proxy.state == "loading":
            # unload and reset take the build lock: refuse rather than hang until the build ends.
            return _error(409, f"encoder {name!r} is loading; {action} it after the build finishes")
        if action == "unload":
            unloaded = await run_in_threadpool(self.manager.unload, name)
            return _json(
                {"action": "unload", "name": name, "unloaded": unloaded, "component": _status(proxy)}
            )
        await run_in_threadpool(self.manager.reset, name)
        return _json({"action": "reset", "name": name, "component": _status(proxy)})

    def _load(self, name: str, proxy: Any) -> Response:
        state = proxy.state
        if self.manager.closed:
            return _error(409, "the manager is closed")
        if state == "disabled":
            return _error(409, f"encoder {name!r} is disabled: {proxy.reason}; POST reset first")
        if state == "unavailable":
            return _error(409, f"encoder {name!r} is unavailable: {proxy.reason}")
        if state == "loaded":
            body = {"action": "load", "name": name, "accepted": False, "message": "already loaded"}
            return _json({**body, "component": _status(proxy)})
        if state == "idle":
            _start_load(self.manager, name)
            message = f"building in the background; watch GET {self.prefix}/components"
        else:
            message = "already loading"
        body = {"action": "load", "name": name, "accepted": True, "message": message}
        return _json({**body, "component": _status(proxy)}, 202)

    def routes(self) -> list[BaseRoute]:
        from starlette.routing import Route

        p = self.prefix
        # Every route takes every method and answers a wrong one itself, as JSON, in any host app.
        return [
            Route(
                p or "/", self._read(self.page, basic=True), methods=_ALL_METHODS, name="lazyenc_admin_page"
            ),
            Route(
                f"{p}/components",
                self._read(self.components),
                methods=_ALL_METHODS,
                name="lazyenc_admin_components",
            ),
            Route(f"{p}/components/{{name}}", self._read(self.component), methods=_ALL_METHODS),
            Route(f"{p}/components/{{name}}/{{action}}", self.action, methods=_ALL_METHODS),
            Route(f"{p}/health", self.health, methods=_ALL_METHODS, name="lazyenc_admin_health"),
            Route(f"{p}/ready", self.ready, methods=_ALL_METHODS, name="lazyenc_admin_ready"),
            Route(self.metrics_path, self._read(self.metrics), methods=_ALL_METHODS, name="lazyenc_metrics"),
        ]


def _credential(header: str, *, basic: bool) -> bytes | None:
    """The token sent in an Authorization header: Bearer, or (if allowed) a Basic password."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip().encode("utf-8", "surrogateescape")
    if basic and scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except ValueError:  # binascii.Error is a ValueError
            return None
        return decoded.partition(b":")[2]
    return None


def _status(proxy: Any) -> dict[str, Any]:
    result: dict[str, Any] = proxy.status().as_dict()
    return result


def _start_load(manager: EncoderManager, name: str) -> threading.Thread:
    def build() -> None:
        try:
            manager.warmup(name)
        except LazyEncError as exc:  # the panel shows the state; the log keeps the message
            log.warning("admin load of %s failed: %s", name, exc)
        except Exception:
            log.exception("admin load of %s failed", name)

    thread = threading.Thread(target=build, name=f"lazyenc-admin-load-{name}", daemon=True)
    thread.start()
    return thread


def routes(
    manager: EncoderManager,
    *,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
    protect_reads: bool | None = None,
    prefix: str = "/admin",
    metrics_path: str = "/metrics",
    refresh_s: float = 5.0,
) -> list[BaseRoute]:
    """The admin and metrics routes, for a host app that builds its own Starlette.

    ``token`` defaults to the environment variable named by ``[admin] token_env``
    (read from ``environ``, default ``os.environ``, once, now); ``protect_reads``
    defaults to ``[admin] protect_reads``.
    """
    _require_admin_extra()
    panel = _Panel(
        manager,
        token=token,
        environ=os.environ if environ is None else environ,
        protect_reads=protect_reads,
        prefix=prefix,
        metrics_path=metrics_path,
        refresh_s=refresh_s,
    )
    return panel.routes()


async def _http_error(request: Request, exc: Exception) -> Response:
    from starlette.exceptions import HTTPException

    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for HTTPException only
        raise exc
    messages = {404: f"no such path: {request.url.path}", 405: f"{request.method} is not allowed here"}
    return _error(exc.status_code, messages.get(exc.status_code, str(exc.detail)), exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("admin request %s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, f"internal error: {type(exc).__name__}")


def create_app(
    manager: EncoderManager,
    *,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
    protect_reads: bool | None = None,
    prefix: str = "/admin",
    metrics_path: str = "/metrics",
    refresh_s: float = 5.0,
    close_manager_on_shutdown: bool = False,
) -> Starlette:
    """A Starlette app serving the panel at ``prefix`` and metrics at ``metrics_path``.

    Mount it anywhere (``Mount("/ops", app=create_app(mgr))`` serves ``/ops/admin``).
    The app's lifespan leaves the host's models alone unless
    ``close_manager_on_shutdown=True``. Errors, unknown paths included, are JSON.
    """
    _require_admin_extra()
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    return Starlette(
        routes=routes(
            manager,
            token=token,
            environ=environ,
            protect_reads=protect_reads,
            prefix=prefix,
            metrics_path=metrics_path,
            refresh_s=refresh_s,
        ),
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan(manager, close_manager=close_manager_on_shutdown),
    )


def serve(
    manager: EncoderManager,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str = "info",
) -> None:
    """Run the panel with uvicorn on ``[admin] host``/``port`` until stopped; closes ``manager``."""
    try:
        _require_admin_extra("uvicorn")
        import uvicorn

        admin = manager.settings.admin
        host = admin.host if host is None else host
        port = admin.port if port is None else port
        app = create_app(manager, close_manager_on_shutdown=True)
        if not log.handlers and not logging.getLogger().handlers:
            # Show builds and unloads next to uvicorn's own lines.
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)-9s lazyenc: %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
        if host not in _LOOPBACK and not admin.protect_reads:
            log.warning(
                "the admin panel listens on %s and its reads need no token ([admin] protect_reads)", host
            )
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        manager.close()
