"""The shared repr, eq and hash of lazyenc's frozen dataclasses behave as generated ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lazyenc import BatchSettings, ComponentStatus, EncoderSettings, Probe, Settings, load_config


@dataclasses.dataclass(frozen=True)
class GeneratedBatchSettings:
    """BatchSettings' fields, with the methods dataclasses generates."""

    enabled: bool = True
    max_size: int = 64
    max_wait_ms: float = 2.0
    max_queue: int = 1024
    queue_timeout_s: float = 10.0
    model_batch_size: int | None = None


def test_repr_matches_the_generated_one() -> None:
    """repr lists every field in order, as @dataclass would."""
    ours = BatchSettings(max_size=8, model_batch_size=4)
    generated = GeneratedBatchSettings(max_size=8, model_batch_size=4)
    assert repr(generated).replace("GeneratedBatchSettings", "BatchSettings") == repr(ours)


def test_equal_values_are_equal_and_hash_alike(example_config: Path) -> None:
    """Two parses of one file give equal, equally hashed settings usable as dict keys."""
    first, second = load_config(example_config), load_config(example_config)
    assert first == second
    assert hash(first) == hash(second)
    assert {first: "x"}[second] == "x"
    assert first != dataclasses.replace(first, source="elsewhere")
    assert first.encoders[0] != first.encoders[1]


def test_other_classes_with_equal_fields_are_not_equal() -> None:
    """Equality needs the same class, as with generated __eq__."""
    assert BatchSettings() != GeneratedBatchSettings()
    assert BatchSettings() != (True, 64, 2.0, 1024, 10.0, None)
    assert BatchSettings().__eq__(object()) is NotImplemented


def test_they_stay_frozen_dataclasses() -> None:
    """fields, replace, asdict and the frozen guard are the standard library's."""
    for cls in (Settings, EncoderSettings, BatchSettings, Probe, ComponentStatus):
        assert dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen  # type: ignore[union-attr]
    settings = BatchSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_size = 1  # type: ignore[misc]
    assert 8 == dataclasses.replace(settings, max_size=8).max_size
    assert 64 == dataclasses.asdict(settings)["max_size"]
