"""The base of lazyenc's frozen dataclasses: one shared ``__repr__``, ``__eq__`` and ``__hash__``.

``@dataclass(frozen=True)`` generates those three methods for every class by
compiling source text at import; for the ten value classes that ``import
lazyenc`` defines that was about 5 ms of the 50 ms init budget (issue 2). The
classes stay real frozen dataclasses (``fields``, ``replace``, ``asdict`` and
the frozen ``__setattr__`` are the standard library's); they are declared with
``repr=False, eq=False`` and inherit these generic methods, which behave as the
generated ones do.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class Value:
    """Mixin for ``@dataclass(frozen=True, repr=False, eq=False)`` classes."""

    __slots__ = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))  # type: ignore[arg-type]

    def __repr__(self) -> str:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields if f.repr)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())
