"""The package logger, created on first use: `import logging` alone costs more
start-up time than the rest of lazyenc's init, and most processes never log."""

from __future__ import annotations

from typing import Any

__all__ = ["log"]


class _LazyLogger:
    def __getattr__(self, name: str) -> Any:
        import logging

        return getattr(logging.getLogger("lazyenc"), name)


log: Any = _LazyLogger()
