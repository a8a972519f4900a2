"""The registry: one proxy per configured encoder."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from ._config import Settings, load_config
from ._exceptions import LazyEncError, UnknownEncoderError
from ._loaders import Loader, default_loader
from ._log import log
from ._memory import Lifecycle
from ._proxy import ComponentStatus, EncoderProxy, proxy_class

__all__ = ["EncoderManager"]


class EncoderManager:
    """Holds a proxy per encoder; builds nothing until first use (unless eager).

    ``loaders`` replaces the loader of some encoders, keyed by encoder name or by
    kind (name first): this is how ``lazyenc.testing`` fakes plug in.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        loaders: Mapping[str, Loader] | None = None,
    ) -> None:
        self._settings = settings
        self._closed = False
        self.eager_warmup_done = settings.hardware.lazy_encoders
        environ = os.environ if environ is None else environ
        loaders = loaders or {}
        # Shared by the proxies: the idle-unload reaper and the memory budget.
        self._lifecycle = Lifecycle(settings.hardware)
        self._proxies: dict[str, EncoderProxy] = {}
        for enc in settings.encoders:
            loader = loaders.get(enc.name) or loaders.get(enc.kind) or default_loader(enc.kind)
            self._proxies[enc.name] = proxy_class(enc.kind)(
                enc, loader=loader, hardware=settings.hardware, environ=environ, lifecycle=self._lifecycle
            )
        if not settings.hardware.lazy_encoders:
            self._eager_warmup()

    @classmethod
    def from_toml(
        cls,
        path: str | os.PathLike[str],
        *,
        environ: Mapping[str, str] = os.environ,
        loaders: Mapping[str, Loader] | None = None,
    ) -> EncoderManager:
        """Read the TOML at ``path`` and build a manager from it."""
        return cls(load_config(path, environ=environ), environ=environ, loaders=loaders)

    @property
    def settings(self) -> Settings:
        """The validated configuration."""
        return self._settings

    @property
    def lazy_encoders(self) -> bool:
        """False when every available encoder was built at init."""
        return self._settings.hardware.lazy_encoders

    # -- registry ---------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        try:
            return self._proxies[name]
        except KeyError:
            raise UnknownEncoderError(name, self._proxies) from None

    def __contains__(self, name: object) -> bool:
        return name in self._proxies

    def __iter__(self) -> Iterator[str]:
        return iter(self._proxies)

    def __len__(self) -> int:
        return len(self._proxies)

    def proxies(self) -> list[EncoderProxy]:
        """Every proxy, in config order."""
        return list(self._proxies.values())

    def __repr__(self) -> str:
        states = ", ".join(f"{p.name}={p.state}" for p in self._proxies.values())
        return f"<EncoderManager {states}>"

    # -- status and lifecycle -------------------------------------------------------
    def status(self) -> list[ComponentStatus]:
        """One snapshot per encoder; never loads anything."""
        return [p.status() for p in self._proxies.values()]

    def warmup(self, *names: str) -> list[ComponentStatus]:
        """Build the named encoders (every available one when none named).

        With names, a failed build raises after the others were tried; without,
        failures only show as ``disabled``.
        """
        targets = (
            [self[n] for n in names]
            if names
            else [p for p in self._proxies.values() if p.state != "unavailable"]
        )
        first_error: LazyEncError | None = None
        for proxy in targets:
            try:
                proxy.load()
            except LazyEncError as exc:
                first_error = first_error or exc
        if names and first_error is not None:
            raise first_error
        return [p.status() for p in targets]

    def _eager_warmup(self) -> None:
        started = time.perf_counter()
        for status in self.warmup():
            log.info("eager warm-up: %s is %s (%s s)", status.name, status.state, status.load_seconds)
        log.info("eager warm-up took %.2f s", time.perf_counter() - started)
        self.eager_warmup_done = True

    def unload(self, name: str) -> bool:
        """Drop the model of ``name``; True if one was loaded."""
        proxy: EncoderProxy = self[name]
        return proxy.unload()

    def reset(self, name: str) -> None:
        """Clear a ``disabled`` state (and probe again) so the next call builds."""
        proxy: EncoderProxy = self[name]
        proxy.reset()

    def close(self) -> None:
        """Unload every encoder; later calls raise EncoderClosedError."""
        if self._closed:
            return
        self._closed = True
        for proxy in self._proxies.values():
            proxy.close()
        self._lifecycle.close()

    def memory(self) -> dict[str, Any]:
        """The memory budget and the estimated cost of what is loaded (see docs/memory.md)."""
        return self._lifecycle.snapshot()

    @property
    def closed(self) -> bool:
        """Whether close() ran."""
        return self._closed

    def __enter__(self) -> EncoderManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
