"""Exceptions raised by lazyenc.

The tree::

    LazyEncError
    ├── ConfigError              the TOML (or an environment override) is wrong
    ├── UnknownEncoderError      no encoder of that name is configured (also a KeyError)
    ├── EncoderUnavailableError  the probe found the library or the model missing
    ├── EncoderLoadError         the build failed; the original exception is ``__cause__``
    ├── MemoryBudgetError        a build would not fit the configured memory budget
    ├── OverloadedError          an encoder's queue is full
    ├── InvalidInputError        an input to a call has the wrong type (also a ValueError)
    ├── EncoderClosedError       the manager was closed
    └── RemoteError              a lazyenc server answered with an error

An exception raised by a model's own code while encoding is not wrapped: it
propagates unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = [
    "ConfigError",
    "EncoderClosedError",
    "EncoderLoadError",
    "EncoderUnavailableError",
    "InvalidInputError",
    "LazyEncError",
    "MemoryBudgetError",
    "OverloadedError",
    "RemoteError",
    "UnknownEncoderError",
]


class LazyEncError(Exception):
    """Something lazyenc itself refused or could not do."""


class ConfigError(LazyEncError):
    """The configuration names a wrong key, type or value."""

    def __init__(self, message: str, *, source: str = "", key: str = "") -> None:
        self.source = source
        self.key = key
        self.detail = message
        where = source
        if key:
            where = f"{source}: [{key}]" if source else f"[{key}]"
        super().__init__(f"{where}: {message}" if where else message)


class UnknownEncoderError(LazyEncError, KeyError):
    """No encoder of that name is configured."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = list(known)
        choices = ", ".join(self.known) or "(none configured)"
        super().__init__(f"no encoder named {name!r}; configured: {choices}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class EncoderUnavailableError(LazyEncError):
    """The encoder cannot be built here: its library or model is missing."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"encoder {name!r} is unavailable: {reason}")


class EncoderLoadError(LazyEncError):
    """Building the encoder failed; it stays disabled until reset."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"encoder {name!r} is disabled: {reason}")


class MemoryBudgetError(LazyEncError):
    """A build would not fit the memory budget, even after evicting idle encoders."""

    def __init__(self, name: str, *, needed_bytes: int, budget: str, detail: str = "") -> None:
        self.name = name
        self.needed_bytes = needed_bytes
        self.budget = budget
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"encoder {name!r} needs about {needed_bytes / 2**20:.0f} MiB, which does not fit {budget}{extra}"
        )


class OverloadedError(LazyEncError):
    """The encoder's request queue is full."""

    def __init__(self, name: str, *, max_queue: int) -> None:
        self.name = name
        self.max_queue = max_queue
        super().__init__(f"encoder {name!r} is overloaded: {max_queue} requests already queued")


class InvalidInputError(LazyEncError, ValueError):
    """An input to an encoder call has the wrong type; only that call fails."""

    def __init__(self, name: str, argument: str, problem: str) -> None:
        self.name = name
        self.argument = argument
        self.problem = problem
        super().__init__(f"encoder {name!r}: {argument} {problem}")


class EncoderClosedError(LazyEncError):
    """The manager that owns this encoder was closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"encoder {name!r} belongs to a closed manager")


class RemoteError(LazyEncError):
    """A lazyenc server answered with an error."""

    def __init__(self, message: str, *, status_code: int = 0, type: str = "", code: str = "") -> None:
        self.status_code = status_code
        self.type = type
        self.code = code
        super().__init__(message)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """A ' (did you mean 'x'?)' suffix, or ''."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
