"""lazyenc's frozen value classes: declared like dataclasses, built without ``dataclasses``."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from lazyenc import (
    BatchSettings,
    ComponentStatus,
    EncoderManager,
    EncoderSettings,
    ExpectSettings,
    Probe,
    Settings,
    load_config,
)
from lazyenc._value import FrozenInstanceError, Value
from lazyenc.testing import FakeLoader, make_settings


class Point(Value):
    """A small value class of the tests' own."""

    x: int
    y: int = 0
    label: str = "p"
    kind: ClassVar[str] = "point"


class Point3(Point):
    """A subclass adds a field after its base's."""

    z: int = 0


def test_fields_are_the_annotations_in_order_without_classvars() -> None:
    """field_names() lists annotated fields in declaration order, base first, ClassVars left out."""
    assert ("x", "y", "label") == Point.field_names()
    assert ("x", "y", "label", "z") == Point3.field_names()
    assert (
        "enabled",
        "max_size",
        "max_wait_ms",
        "max_queue",
        "queue_timeout_s",
        "model_batch_size",
        "parallel",
    ) == (BatchSettings.field_names())


def test_defaults_fill_missing_arguments() -> None:
    """A field not given takes its declared default."""
    point = Point(1)
    assert (1, 0, "p") == (point.x, point.y, point.label)
    assert 64 == BatchSettings().max_size
    assert ExpectSettings() == EncoderSettings(name="a", kind="dense", model="m").expect


def test_positional_and_keyword_arguments_both_work() -> None:
    """Arguments bind in field order, as a dataclass's __init__ does."""
    assert Point(1, 2, "q") == Point(x=1, y=2, label="q") == Point(1, label="q", y=2)
    assert Probe(available=False, reason="gone") == Probe(False, "gone")


def test_wrong_arguments_are_type_errors_naming_the_field() -> None:
    """Unknown, missing, duplicated and surplus arguments raise TypeError."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_sizee'"):
        BatchSettings(max_sizee=8)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing required arguments: name, model"):
        EncoderSettings(kind="dense")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes 3 positional arguments but 4 were given"):
        Point(1, 2, "q", 4)  # type: ignore[call-arg]


def test_instances_are_frozen() -> None:
    """Assigning or deleting any attribute raises FrozenInstanceError, an AttributeError."""
    settings = BatchSettings()
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'max_size'"):
        settings.max_size = 1  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError, match="cannot delete field 'max_size'"):
        del settings.max_size  # type: ignore[misc]
    with pytest.raises(AttributeError):
        settings.other = 1  # type: ignore[attr-defined]
    assert 64 == settings.max_size
    assert issubclass(FrozenInstanceError, AttributeError)


def test_replace_returns_a_changed_copy() -> None:
    """replace() leaves the original alone and keeps the fields it is not given."""
    settings = BatchSettings(max_size=8)
    changed = settings.replace(max_wait_ms=5.0)
    assert BatchSettings(max_size=8, max_wait_ms=5.0) == changed
    assert BatchSettings(max_size=8) == settings
    assert Point3(1, z=3) == Point3(1).replace(z=3)


def test_replace_with_an_unknown_field_is_a_type_error_naming_it() -> None:
    """A misspelt name in replace() is refused rather than dropped."""
    with pytest.raises(TypeError, match="BatchSettings has no field 'max_sizee'"):
        BatchSettings().replace(max_sizee=8)


def test_equal_values_are_equal_and_hash_alike(example_config: Path) -> None:
    """Two parses of one file give equal, equally hashed settings usable as dict keys."""
    first, second = load_config(example_config), load_config(example_config)
    assert first == second
    assert hash(first) == hash(second)
    assert "x" == {first: "x"}[second]
    assert first != first.replace(source="elsewhere")
    assert first.encoders[0] != first.encoders[1]


def test_equality_needs_the_same_class() -> None:
    """A subclass, a tuple of the same values or another object never compares equal."""
    assert Point(1) != Point3(1)
    assert BatchSettings() != (True, 64, 2.0, 1024, 10.0, None)
    assert NotImplemented is BatchSettings().__eq__(object())


def test_repr_lists_every_field_in_order() -> None:
    """repr() reads like the dataclass repr: qualified class name and field=value pairs."""
    assert "Point3(x=1, y=0, label='p', z=2)" == repr(Point3(1, z=2))
    expected = (
        "BatchSettings(enabled=True, max_size=8, max_wait_ms=2.0, max_queue=1024, "
        "queue_timeout_s=10.0, model_batch_size=4, parallel=None)"
    )
    assert expected == repr(BatchSettings(max_size=8, model_batch_size=4))


def test_as_dict_turns_nested_values_into_json_ready_dicts(example_config: Path) -> None:
    """as_dict() recurses into nested values, tuples and mappings, as dataclasses.asdict does."""
    settings = load_config(example_config)
    doc = settings.as_dict()
    assert list(Settings.field_names()) == list(doc)
    assert {"num_labels": 1} == doc["encoders"][1]["options"]
    assert 64 == doc["encoders"][0]["batch"]["max_size"]
    assert str(example_config) == json.loads(json.dumps(doc))["source"]


def test_component_status_as_dict_holds_every_field() -> None:
    """The admin panel, CLI and server read ComponentStatus.as_dict(): one key per field."""
    with EncoderManager(make_settings({"enc": "dense"}), loaders={"enc": FakeLoader()}) as manager:
        status = manager.status()[0]
    assert list(ComponentStatus.field_names()) == list(status.as_dict())
    assert {"name": "enc", "state": "idle"} == {k: status.as_dict()[k] for k in ("name", "state")}


def test_a_mutable_default_is_refused_at_class_definition() -> None:
    """A list default would be shared by every instance, so the class is not created."""
    with pytest.raises(ValueError, match="mutable default list"):

        class Bad(Value):
            items: list[int] = []


def test_a_field_without_default_after_one_with_default_is_refused() -> None:
    """Field order follows the dataclass rule, so positional construction stays unambiguous."""
    with pytest.raises(TypeError, match="non-default field 'b' follows a default one"):

        class Bad(Value):
            a: int = 0
            b: int


def test_a_field_cannot_shadow_the_value_api() -> None:
    """A field named like a Value method would hide it, so the class is not created."""
    with pytest.raises(TypeError, match="cannot be named 'replace'"):

        class Bad(Value):
            replace: int = 0


def test_values_pickle_copy_and_match() -> None:
    """Pickling and copying give equal values; positional match patterns bind fields in order."""
    settings = EncoderSettings(name="a", kind="dense", model="m", batch=BatchSettings(max_size=8))
    assert settings == pickle.loads(pickle.dumps(settings))
    assert settings == copy.deepcopy(settings)
    match Point(1, 2):
        case Point(x, y):
            assert (1, 2) == (x, y)


def test_import_lazyenc_does_not_import_dataclasses_or_inspect(example_config: Path) -> None:
    """Issue 2: import, from_toml and status() leave out dataclasses and inspect (about 15 ms)."""
    code = (
        "import json, sys, lazyenc\n"
        f"lazyenc.EncoderManager.from_toml({str(example_config)!r}).status()\n"
        "print(json.dumps([m for m in ('dataclasses', 'inspect', 'ast') if m in sys.modules]))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert [] == json.loads(out.stdout.strip().splitlines()[-1])
