"""Server mode: one process holds the models, others reach them over HTTP.

    app = create_app(EncoderManager.from_toml("lazyenc.toml"))

Endpoints (see docs/server.md): ``POST /v1/embeddings`` (OpenAI), ``POST /v1/rerank``
(Cohere and Jina), ``POST /v1/sparse``, ``GET /v1/models``. ``lazyenc serve`` runs
the app under uvicorn. Starlette and uvicorn are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from . import _server_handlers as handlers
from ._config import ServerSettings, load_config
from ._exceptions import ConfigError
from ._manager import EncoderManager

__all__ = ["api_keys", "create_app", "is_loopback", "serve"]

log = logging.getLogger("lazyenc.server")


def api_keys(settings: ServerSettings, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The allowed keys: the comma-separated value of ``[server] api_keys_env``; () when unset.

    A named variable that is missing or empty is a configuration error, not an open server.
    """
    if not settings.api_keys_env:
        return ()
    env = os.environ if environ is None else environ
    keys = tuple(k.strip() for k in env.get(settings.api_keys_env, "").split(",") if k.strip())
    if not keys:
        raise ConfigError(
            f"names the environment variable {settings.api_keys_env!r}, which is unset or empty",
            key="server.api_keys_env",
        )
    return keys


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_app(
    manager: EncoderManager,
    *,
    extra_routes: Sequence[Any] = (),
    settings: ServerSettings | None = None,
    environ: Mapping[str, str] | None = None,
    close_manager: bool = True,
) -> Any:
    """The Starlette app serving ``manager``'s encoders.

    ``extra_routes`` (starlette routes, such as the admin panel's) are mounted
    beside the API; they bring their own authentication. ``settings`` defaults to
    the manager's ``[server]`` table, keys come from ``environ`` (default
    ``os.environ``). On shutdown the manager is closed unless ``close_manager`` is
    false.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    server = settings or manager.settings.server
    ctx = handlers.Context(manager=manager, settings=server, api_keys=api_keys(server, environ))

    def endpoint(fn: Any) -> Any:
        async def run(request: Any) -> Any:
            try:
                ctx.authorize(request)
                return await fn(request, ctx)
            except handlers.ApiError as exc:
                return exc.response()

        run.__name__ = fn.__name__
        return run

    async def http_error(request: Any, exc: Any) -> Any:
        # Unknown paths and wrong methods under /v1 answer in the API's error shape too.
        if request.url.path.startswith("/v1/"):
            code = "not_found" if exc.status_code == 404 else "method_not_allowed"
            message = f"{request.method} {request.url.path}: {exc.detail}"
            return handlers.ApiError(exc.status_code, message, code=code, headers=exc.headers).response()
        return PlainTextResponse(str(exc.detail), status_code=exc.status_code, headers=exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        log.info(
            "lazyenc server: %d encoders, %s", len(manager), "keys required" if ctx.api_keys else "no keys"
        )
        try:
            yield
        finally:
            if close_manager:
                manager.close()
                log.info("lazyenc server: encoders unloaded, manager closed")

    routes = [
        Route("/v1/models", endpoint(handlers.models), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint(handlers.model), methods=["GET"]),
        Route("/v1/embeddings", endpoint(handlers.embeddings), methods=["POST"]),
        Route("/v1/rerank", endpoint(handlers.rerank), methods=["POST"]),
        Route("/v1/sparse", endpoint(handlers.sparse), methods=["POST"]),
        *extra_routes,
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})


def _admin_routes(manager: EncoderManager, environ: Mapping[str, str]) -> list[Any]:
    """The admin panel and /metrics, served beside the API."""
    from .admin import routes

    return list(routes(manager, environ=environ))


def serve(
    config: str | os.PathLike[str],
    *,
    host: str | None = None,
    port: int | None = None,
    insecure: bool = False,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the server until SIGTERM or Ctrl-C; returns the exit code.

    Refuses a non-loopback host without API keys unless ``insecure``. On SIGTERM
    uvicorn stops accepting, lets in-flight requests finish, then the lifespan
    unloads every encoder; the process then exits 0.
    """
    env = os.environ if environ is None else environ
    settings = load_config(config, environ=env)
    host = host or settings.server.host
    port = settings.server.port if port is None else port
    keys = api_keys(settings.server, env)
    if not keys and not is_loopback(host) and not insecure:
        raise ConfigError(
            f"refusing to serve on {host} without API keys: set api_keys_env (and that variable), "
            "bind a loopback host, or pass --insecure",
            source=settings.source,
            key="server.api_keys_env",
        )
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("server mode needs uvicorn and starlette: pip install 'lazyenc[server]'") from None

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    if not keys and not is_loopback(host):
        log.warning("serving on %s without API keys (--insecure): anyone who can reach it may use it", host)
    manager = EncoderManager(settings, environ=env)
    try:
        app = create_app(manager, extra_routes=_admin_routes(manager, env), environ=env)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
        # uvicorn re-raises the signal it handled once it has shut down; a graceful
        # stop on SIGTERM is a success, so that second delivery is swallowed.
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        try:
            server.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        manager.close()
    return 0 if server.started else 1
