"""Frozen value classes, declared like dataclasses, without importing ``dataclasses``.

``import dataclasses`` pulls in ``inspect`` (and with it ``ast``, ``dis`` and
``tokenize``): about 15 ms, and ``@dataclass(frozen=True)`` then compiles an
``__init__``, ``__setattr__`` and ``__delattr__`` per class, about 5 ms more for
the ten classes ``import lazyenc`` defines. Against issue 2's 50 ms init budget
that was a third of it. :class:`Value` reads the annotated fields once per class
in ``__init_subclass__`` and shares one generic ``__init__``, ``__repr__``,
``__eq__`` and ``__hash__``, which behave as the generated ones do.

    class BatchSettings(Value):
        enabled: bool = True
        max_size: int = 64

    BatchSettings(max_size=8).replace(enabled=False)

Fields are the class's annotations (``ClassVar`` ones excepted), base classes'
first; a default must be hashable, so mutable defaults cannot be shared.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover

    def dataclass_transform(**kwargs: Any) -> Any:
        return lambda cls: cls


if TYPE_CHECKING:
    from typing import TypeVar

    # Only for mypy: at run time a string bound costs a compile() (about 1 ms).
    _V = TypeVar("_V", bound="Value")

__all__ = ["FrozenInstanceError", "Value"]

_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """A field of a frozen value was assigned or deleted."""


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar


@dataclass_transform(frozen_default=True)
class Value:
    """Base of lazyenc's frozen value classes: fields, ``replace``, ``as_dict``, eq, hash, repr."""

    __slots__ = ()

    # Per class, set by __init_subclass__: field names in order, and their defaults.
    _field_names: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        defaults = dict(cls._defaults)
        names = list(cls._field_names)
        for name, annotation in cls.__annotations__.items():
            if _is_classvar(annotation):
                continue
            if hasattr(Value, name):
                raise TypeError(f"{cls.__qualname__}: a field cannot be named {name!r}")
            if name not in names:
                names.append(name)
            default = cls.__dict__.get(name, _MISSING)
            if default is not _MISSING:
                if type(default).__hash__ is None:
                    raise ValueError(
                        f"{cls.__qualname__}.{name}: mutable default {type(default).__name__} "
                        "would be shared by every instance"
                    )
                defaults[name] = default
            else:
                defaults.pop(name, None)  # a base's field redeclared without a default
        seen_default = False
        for name in names:
            if name in defaults:
                seen_default = True
            elif seen_default:
                raise TypeError(f"{cls.__qualname__}: non-default field {name!r} follows a default one")
        cls._field_names = tuple(names)
        cls._defaults = defaults
        # Positional `case BatchSettings(...)` patterns; mypy derives the same tuple itself.
        cls.__match_args__ = cls._field_names  # type: ignore[attr-defined,misc]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        names = cls._field_names
        if len(args) > len(names):
            raise TypeError(
                f"{cls.__qualname__}() takes {len(names)} positional arguments but {len(args)} were given"
            )
        values = dict(zip(names, args, strict=False))  # fewer args than fields is fine
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument {name!r}")
            if name in values:
                raise TypeError(f"{cls.__qualname__}() got multiple values for argument {name!r}")
            values[name] = value
        if len(values) < len(names):
            missing = [n for n in names if n not in values and n not in cls._defaults]
            if missing:
                raise TypeError(f"{cls.__qualname__}() missing required arguments: {', '.join(missing)}")
            values = {n: values[n] if n in values else cls._defaults[n] for n in names}
        # Instances have a __dict__ (subclasses declare no __slots__); writing it bypasses __setattr__.
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the fields, in declaration order."""
        return cls._field_names

    def replace(self: _V, **changes: Any) -> _V:
        """A copy with some fields changed; an unknown name is a TypeError."""
        unknown = [name for name in changes if name not in self._field_names]
        if unknown:
            raise TypeError(f"{type(self).__qualname__} has no field {unknown[0]!r}")
        return type(self)(**{**self.__dict__, **changes})

    __replace__ = replace  # copy.replace() on Python 3.13+

    def as_dict(self) -> dict[str, Any]:
        """Every field by name, nested values and mappings turned into dicts (for JSON)."""
        return {name: _plain(getattr(self, name)) for name in self._field_names}

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._field_names)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._field_names)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())


def _plain(value: Any) -> Any:
    if isinstance(value, Value):
        return value.as_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
